/*
 * _walk_client.c: in an extension compiled with WALK_CLIENT (_bitmap, _bloom, _packwrite), the _walk
 * extension's functions and objects that _walk.h declares, as pointers taken from _walk's C API capsule
 * (one Packs type, one WalkError, one reader for every extension that reads objects). _bitmap and _bloom
 * take them when they load; _packwrite when find_reuse or copy_entries is first called (its idx tables need
 * nothing of _walk, and it loads while packyard.store.pack is still importing, before _walk can).
 */
#include "_walk.h"

PyTypeObject *walk_packs_type;
PyObject *WalkError;
WALK_API_FUNCTIONS(WALK_API_MEMBER)

int
walk_client_import(void)
{
    if (walk_packs_type)
        return 0;
    /* (not PyCapsule_Import: it reaches the module through the packages' attributes, which a package still
     * running its __init__ has not got yet; the import system finds a submodule of one) */
    PyObject *mod = PyImport_ImportModule("packyard.store.maintenance.walk._walk");
    PyObject *capsule = mod ? PyObject_GetAttrString(mod, "_C_API") : NULL;
    const WalkAPI *api = capsule ? PyCapsule_GetPointer(capsule, WALK_API_CAPSULE) : NULL;
    Py_XDECREF(capsule);
    Py_XDECREF(mod);
    if (!api)
        return -1;
    if (api->version != WALK_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "%s: version %d, this extension was built for %d", WALK_API_CAPSULE,
                     api->version, WALK_API_VERSION);
        return -1;
    }
    walk_packs_type = api->packs_type;
    WalkError = api->walk_error;
#define TAKE(ret, name, params) name = api->name;
    WALK_API_FUNCTIONS(TAKE)
#undef TAKE
    return 0;
}
