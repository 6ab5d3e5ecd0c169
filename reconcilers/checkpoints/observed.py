"""What the checkpoints kind observes: plain data, made in the observer child and sent back
pickled (no file checks imported here, so `diff`'s parent process stays light)."""

from __future__ import annotations

from dataclasses import dataclass

# Layouts whose quarantine lies beside dir, in its parent: their rule reaches every entry of dir
# (litgpt's rglob walks hidden folders; the Fabric example's sorted(os.listdir(dir))).
QUARANTINE_BESIDE = ("litgpt", "fabric")
LAYOUTS = ("hf-trainer", "lightning", "deepspeed", "dcp", "megatron", "accelerate", "diffusers", "litgpt", "fabric",
           "orbax")


class NotCheckable(ValueError):
    """A run directory in a form its layout does not check (reported as an error, never ok)."""


@dataclass(frozen=True)
class StepObserved:
    """One saved checkpoint: its step, where it is (relative to the run directory), whether
    what the framework's loader reads of it is whole, and if not, why."""

    step: int | None  # None: a Lightning file whose step cannot be read (a torn last.ckpt)
    path: str  # relative to dir: "checkpoint-6", "global_step6", "last.ckpt", "checkpoints/checkpoint_3"
    whole: bool
    reason: str = ""  # why not whole (the first problem found)
    mtime: float = 0.0  # the newest mtime among its files (a directory's own entry included)
    files: int = 0
    size: int = 0
    unproven: str = ""  # what the files cannot prove even when whole (safetensors without checksums)
    pointer: bool = False  # Lightning: a last*.ckpt file, a candidate of ckpt_path="last"
    link: bool = False  # Lightning: a symbolic link (save_last="link")

    @property
    def unreadable(self) -> bool:
        """A file of it could not be read (EIO, EACCES): neither whole nor torn, never moved."""
        return self.reason.startswith("unreadable:") or ": unreadable: " in self.reason


@dataclass(frozen=True)
class CheckpointsObserved:
    """A run directory: its layout (declared or detected), the steps present, the step the
    framework will resume from by its own rule, and the newest whole step."""

    dir: str
    layout: str
    detected: bool  # the layout was detected, not declared
    exists: bool
    steps: tuple[StepObserved, ...] = ()
    resume_path: str | None = None  # what the framework's rule picks (None: it starts from scratch)
    resume_step: int | None = None
    resume_rule: str = ""  # the rule, in words, with its upstream function
    resume_problem: str = ""  # why the pick is not loadable (a pointer naming a missing step, torn)
    empty_pick: str = ""  # what the framework does when its rule picks nothing (raise, or start from scratch)
    blocker: str = ""  # something apply will not move that stops the framework's resume (a person must)
    pointer_text: str | None = None  # DeepSpeed `latest` / Megatron tracker, as read (None: absent)
    newest_whole_path: str | None = None
    newest_whole_step: int | None = None
    newest_whole_mtime: float | None = None
    depth: str = "structure"  # how deep the resume candidate was read ("content": every byte)
    from_records: int = 0  # steps not read again: unchanged since checked (their check record, records.py)

    def step_at(self, path: str | None) -> StepObserved | None:
        for s in self.steps:
            if s.path == path:
                return s
        return None

    @property
    def resume_whole(self) -> bool | None:
        """Whether the pick is whole; None when the framework would start from scratch."""
        if self.resume_path is None:
            return None
        s = self.step_at(self.resume_path)
        return bool(s and s.whole and not self.resume_problem)
