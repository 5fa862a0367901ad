"""The `--out` folder of `llmopt quantize`: which ones are refused, the staging folder beside it where the
checkpoint is written, and the move into place.

Names beside `--out` (all hidden, all carrying the pid of the run that made them, so that a later run can
tell a killed run's leftovers from a live run's work):
  .<out>-staging-<pid>-<random>  the checkpoint being written
  .<out>-old-<pid>               the previous checkpoint, moved aside while the new one is moved in
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path


class CheckpointWriteError(Exception):
    """Writing or publishing the checkpoint failed; the message says what is left where."""


def model_sources(model: str | None) -> list[Path]:
    """The paths given as the model, before it is resolved: a folder or .gguf file, or the bundled GGUF
    (the converted folder they resolve to is checked once it is known)."""
    from llmopt.checkpoints import DEFAULT_MODEL, bundled_gguf_path

    if model is None or model == DEFAULT_MODEL:
        return [bundled_gguf_path()]
    path = Path(model).expanduser()
    return [path] if path.exists() else []  # a missing model is resolve_model's error to report


def refuse_source_overlap(out: Path, sources: Iterable[Path]) -> None:
    """Refuse an `--out` that is a source, lies inside one or holds one: publishing renames `--out`
    aside and deletes it, and staging writes beside it. Symlinks are resolved on both sides."""
    target = out.resolve()
    for source in sources:
        resolved = source.resolve()
        if target == resolved:
            relation = "is"
        elif resolved in target.parents:
            relation = "is inside"
        elif target in resolved.parents:
            relation = "contains"
        else:
            continue
        raise ValueError(
            f"--out {out} {relation} the model being quantized ({resolved}): choose another folder"
        )


def refuse_existing(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists: choose another --out or pass --overwrite")


def make_staging_dir(out: Path) -> Path:
    """A new staging folder beside `out` (the final rename is atomic within one file system)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}-staging-{os.getpid()}-", dir=out.parent))
    except OSError as exc:
        raise ValueError(f"cannot write to {out.parent}: {exc.strerror}") from None


def old_dir(out: Path) -> Path:
    return out.with_name(f".{out.name}-old-{os.getpid()}")


def leftover_patterns(out: Path) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(staging, old) names of `out` with the owner's pid as group 1. mkdtemp's random part has no '-',
    so another --out's names (say of "ckpt-staging-5") never match these."""
    name = re.escape(out.name)
    return re.compile(rf"\.{name}-staging-(\d+)-[a-z0-9_]+"), re.compile(rf"\.{name}-old-(\d+)")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but is someone else's (EPERM), or we cannot tell: keep its folder
    return True


def remove_stale_staging(out: Path) -> None:
    """Clean up after runs of the same `--out` that were killed; a live run's folders are left alone."""
    staging_name, old_name = leftover_patterns(out)
    if not out.parent.is_dir():
        return
    for entry in sorted(out.parent.iterdir()):
        if (match := staging_name.fullmatch(entry.name)) and not process_alive(int(match[1])):
            shutil.rmtree(entry, ignore_errors=True)
        elif (match := old_name.fullmatch(entry.name)) and not process_alive(int(match[1])):
            if out.exists() or out.is_symlink():
                remove(entry)  # the new checkpoint was in place; only deleting the old one was cut short
            else:
                # Killed between moving the old checkpoint aside and the new one in: put it back (if that
                # fails too, it stays where it is, for the user to find).
                with suppress(OSError):
                    os.rename(entry, out)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def publish(staging: Path, out: Path) -> None:
    """Move the finished checkpoint into place; an old one (with --overwrite) is replaced whole. If the
    new one cannot be moved in, the old one is moved back, and the message says so."""
    old = None
    if out.exists() or out.is_symlink():
        old = old_dir(out)
        os.rename(out, old)  # if this fails nothing has moved: the caller's OSError handling reports it
    try:
        os.rename(staging, out)
    except OSError as exc:
        raise CheckpointWriteError(put_back(old, out, exc)) from None
    if old is not None:
        remove(old)


def put_back(old: Path | None, out: Path, exc: OSError) -> str:
    """Move the old checkpoint back to `out` after the new one failed to go there; say what is where
    (the caller removes the staging folder with the new checkpoint)."""
    failed = f"could not move the new checkpoint into {out} ({exc.strerror or exc}); it was removed"
    if old is None:
        return failed
    try:
        os.rename(old, out)
    except OSError as again:
        # Left under its pid name: the next run of this --out moves it back once this process is gone.
        return f"{failed}; the previous checkpoint could not be moved back ({again.strerror}): it is in {old}"
    return f"{failed}; the previous checkpoint is back in place"
