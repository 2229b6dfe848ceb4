"""One exception family; each error carries the one-line message users see."""

from __future__ import annotations


class CkptError(Exception):
    """Base of every error ckpt-tui reports to a user as one line."""

    def __str__(self) -> str:
        return " ".join(str(self.args[0]).split()) if self.args else type(self).__name__


class ReadError(CkptError):
    """The input cannot be read as a checkpoint."""


class ReadStopped(ReadError):
    """A read that stops the whole work, never one value's "unreadable" (which would read as a finding about the
    file: "DIFFERENT", exit 1): the file changed since it opened, or its remote store failed."""


class FileChanged(ReadStopped):
    """A file was replaced or rewritten after it was opened: its values would not be the ones its tree and
    verdict describe, so they are never read (open it again)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: the file changed on disk since it was opened; open it again")


class StoreFailed(ReadStopped):
    """A remote store failed while values were read (access refused, an expired signature, a timeout, the budget
    spent): the file was not read, which says nothing of its values."""


class ShortRead(ReadError):
    """A file ends before the bytes its metadata points at (truncated?), as opposed to a read refused or failed
    (the --max-download budget, the network): only this one says "truncated"."""


class UnsafePickle(ReadError):
    """A pickle the reader refused that names a global ``torch.load(weights_only=False)`` would import and run:
    its message says so, and no other account of the file (a text file: protocol 0 is all text) replaces it."""


class UnwrittenRecord(ReadError):
    """A zip record torch's reader "reads" without writing a byte of it (a directory to miniz, or compressed
    size 0): ``torch.load`` hands back the buffer it allocated, uninitialised, never the record's bytes."""


class EditError(CkptError):
    """An edit does not apply to this checkpoint (nothing to change, or a collision)."""


class NothingChanges(EditError):
    """An edit that would leave the checkpoint as it is (a rename to the same name, a device map that moves no
    tensor): the browser says so and records no edit."""


class NoSuchKey(EditError):
    """A key path given by the user is not in the file (a bad argument: the CLI exits 2)."""


class BadArgument(EditError):
    """An edit's argument is malformed, whatever the file (a rename rule without OLD=, a device torch cannot
    parse, an empty prefix): a bad argument, the CLI exits 2."""


class WriteError(CkptError):
    """A write was refused or failed; nothing was left behind."""


class WriteRefused(WriteError):
    """A value the writer cannot write; ``bare`` is the refusal without the way out, which names ``convert``'s
    options (a verb with other options says its own)."""

    def __init__(self, message: str, bare: str) -> None:
        super().__init__(message)
        self.bare = bare


class Cancelled(CkptError):
    """Long work was cancelled by the user."""
