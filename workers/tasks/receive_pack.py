"""receive_pack: one push from a git client, queued by ``packyard receive-pack`` (PACKYARD_RECEIVE_MODE=queue).

The receiving process spooled the client's pack into the incoming dir (``pack``, opened here by the task
boundary) and waits, sending the client keepalives, for this job's result: the pack through index-pack's
checks into a quarantine, then under the repository lease the install and one ref transaction
(workers/commands/receive_pack.py's ``push_job``, the function the receiving process runs itself in process
mode). The worker's settings decide the rules (non-fast-forwards, deletes, hidden refs, fsck, pack limit).
A refused pack fails the job (``PushUnpackFailed``); refused refs are verdicts in the result.
"""
from __future__ import annotations

from typing import Any, BinaryIO

from packyard.workers.app import app
from packyard.workers.commands import receive_pack as command
from packyard.workers.confine import InputKind
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.receive_pack", bind=True, base=PackyardTask, inputs={"pack": InputKind.FILE})
def receive_pack(self: PackyardTask, repo: str, commands: list[dict], pack: str | None = None,
                 push_options: list[str] | None = None, atomic: bool = False) -> dict[str, Any]:
    """Ingest the push's pack and apply its commands (git receive-pack's rules); the verdicts for the report."""
    import base64

    from packyard.workers.receive.hooks import HookConfig, Hooks
    from packyard.workers.receive.queued import HookOutput
    from packyard.workers.settings import get_settings

    self.progress("push taken", 0)   # the waiting client sees PROGRESS: a worker has it
    f: BinaryIO | None = pack        # type: ignore[assignment]  # opened by the task boundary (None: deletes only)
    output = bytearray()             # the hooks' output: as it comes to the waiting client, and in the result
    s = get_settings()
    stream = HookOutput.open(s, self.request.id)

    def emit(data: bytes, **_: Any) -> None:
        output.extend(data)
        stream.append(data)

    hooks = Hooks(HookConfig.from_settings(s), emit=emit, push_options=push_options or [])
    cmds = command.commands_from(commands)
    result = self.call(command.push_job, repo, f, cmds, atomic=atomic, push_options=push_options or [],
                       lock=lambda: self.repo_lock(repo), hooks=hooks)
    if result["unpack"] is not None:
        raise command.unpack_failure(result)
    hooks.post_receive(cmds)         # its outcome is only recorded, as git's
    result["counters"] = command.push_counters(result["counters"], cmds, hooks)
    result["hook_output"] = base64.b64encode(bytes(output)).decode("ascii")
    return result
