"""Online DPO's reference, replaced by the policy's weights every ``spin.ref_update_freq``
steps (verl's SPIN recipe: ``trainer.ref_update_freq``).

At the start of step ``g`` with ``g % ref_update_freq == 0`` the actor's weights are
exported as a Hugging Face directory (``<output_dir>/spin_reference``, the engine's own
``save_hf``: gathered from shards, in the actor's dtype) and the reference rebuilds its
engine from it (:meth:`temper.roles.reference.Reference.reload`: the builder of the
run's first reference, on ``reference.strategy``) — so every engine (torch, fsdp2,
deepspeed, megatron) refreshes the same way, in this process or on each rank of a Ray
worker group (which read the directory as they write checkpoints), and the new reference
computes exactly the log-probs the actor computes at those weights (in the compute
dtype a frozen engine stores).

A checkpoint holds the export's files (the reference is a function of no other saved
state once it has been refreshed), so a resumed run scores with the reference the
uninterrupted run had. verl copies the actor's checkpoint into the reference worker
group through a temporary directory the same way; its copy is not part of a checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from temper.config.schema import TemperConfig
from temper.roles.base import ActorRole, ReferenceRole

EXPORT_DIR = "spin_reference"


def refresh_due(step: int, freq: int) -> bool:
    """Whether step ``step`` (counted from 1) starts with a refresh: ``freq > 0`` and
    ``step % freq == 0`` (verl's test on its global step, which also counts from 1)."""
    return freq > 0 and step % freq == 0


class ReferenceRefresh:
    """Replaces the reference's engine by one holding the actor's current weights."""

    def __init__(
        self,
        cfg: TemperConfig,
        actor: ActorRole,
        reference: ReferenceRole,
        out_dir: Path,
    ) -> None:
        self.cfg = cfg
        self.actor = actor
        self.reference = reference
        self.export = out_dir / EXPORT_DIR
        self.refreshed_at = 0  # the step that last refreshed it (0: the initial policy)

    def maybe_refresh(self, step: int) -> bool:
        """Refresh at the start of ``step`` if it is due; whether it was."""
        if not refresh_due(step, self.cfg.spin.ref_update_freq):
            return False
        # written beside, then renamed: a kill mid-export leaves the previous one whole
        partial = self.export.with_name(EXPORT_DIR + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.actor.engine.save_hf(str(partial))
        shutil.rmtree(self.export, ignore_errors=True)
        partial.rename(self.export)
        self.reference.reload(str(self.export))
        self.refreshed_at = step
        return True

    def state_dict(self) -> dict[str, Any]:
        """The step of the last refresh and, after one, the export's files (bytes)."""
        if not self.refreshed_at:
            return {"refreshed_at": 0}
        files = {
            str(f.relative_to(self.export)): f.read_bytes()
            for f in sorted(self.export.rglob("*"))
            if f.is_file()
        }
        return {"refreshed_at": self.refreshed_at, "files": files}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rebuild the reference a checkpoint's run had (none refreshed: the initial one)."""
        self.refreshed_at = int(state.get("refreshed_at", 0))
        if not self.refreshed_at:
            return
        shutil.rmtree(self.export, ignore_errors=True)
        for name, data in state["files"].items():
            path = self.export / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        self.reference.reload(str(self.export))
