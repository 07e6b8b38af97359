/*
 * _packwrite.c: the module packyard.store.pack._packwrite, the pack writer's hot loops in C:
 *
 *   _packwrite_copy.c  a repack's write plan over the _walk extension's Packs (writeplan.py, reuse.py specify it):
 *                      find_reuse, write_order, copy_entries, check_chains
 *   _packwrite_idx.c   a pack's .idx v2 and .rev tables (idxwrite.write_index specifies them)
 *
 * The Packs type, WalkError and zlib come from the _walk extension's C API capsule (_walk_client.c), taken
 * on the first call that needs them: the idx tables need nothing of it, and this module loads while
 * packyard.store.pack is still importing (idxwrite), before _walk's package can.
 */
#include "_walk.h"

static PyMethodDef packwrite_methods[] = {
    {"find_reuse", find_reuse, METH_VARARGS,
     "find_reuse(packs, ids): (kind, delta base position 'i', global entry number 'q') per id (reuse.find_reuse)"},
    {"whole_headers", whole_headers, METH_VARARGS,
     "whole_headers(packs, kind, gids 'q') -> (type bytes, size 'Q' bytes): each whole entry's header (writeplan._search)"},
    {"copy_entries", copy_entries, METH_VARARGS,
     "copy_entries(packs, gids, order, start, stop, reused, rbase, offsets, pos, limit): a run of entry copies"},
    {"write_order", write_order, METH_VARARGS,
     "write_order(kind, reused, rbase, cbase) -> (order 'i', Python's order indexes 'i', cycle position or -1)"},
    {"check_chains", check_chains, METH_VARARGS,
     "check_chains(reused, base 'i', limit) -> (height 'i' bytes, dropped): writeplan._check_chains"},
    {"index_tables", index_tables, METH_VARARGS,
     "index_tables(oids, offsets 'Q', crcs 'I', off32_limit): a pack's idx v2 and rev tables (idxwrite.write_index)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef packwrite_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.pack._packwrite",
    .m_doc = "the pack writer's copy loop and idx tables (C); specified in writeplan.py, reuse.py and idxwrite.py",
    .m_size = -1,
    .m_methods = packwrite_methods,
};

PyMODINIT_FUNC
PyInit__packwrite(void)
{
    return PyModule_Create(&packwrite_module);   /* (_walk's C API: on the first find_reuse/copy_entries) */
}
