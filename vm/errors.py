"""Errors the VMs raise. Each message names what is wrong: queue, task, opcode, buffer, counter."""


class MegavmError(RuntimeError):
    pass


class DeadlockError(MegavmError):
    """No queue head can run and the program is not finished."""


class RaceError(MegavmError):
    """Checking mode saw an access out of program order: a read before all its writers finished, or a
    write while an older value still had unfinished readers."""


class InputError(ValueError):
    """A runtime input (token id, position) is outside what the program can take; nothing was run."""


class DeviceError(MegavmError):
    """The megakernel aborted (wait timeout, unknown opcode, bad input) and reported a dump."""

    def __init__(self, message: str, dump: dict | None = None):
        super().__init__(message)
        self.dump = dump or {}
