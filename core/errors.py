"""The errors megavm raises on purpose. Each message names what is wrong: the argument, file, field,
tensor, token id, task, opcode, buffer or counter.

  MegavmError
    UserError        something a user or an input file got wrong; the CLI prints one line, exit 2
      InputError       a runtime input (token id, position) the program cannot take; nothing ran
      ConfigError      a model config megavm cannot lower (names the field and value)
      CheckpointError  a checkpoint folder megavm cannot load (names the file or tensor)
    BuildError       the megakernel could not be built or loaded
    RunError         a run failed: the verdict is FAIL, exit 1
      DeadlockError, RaceError, DeviceError
Any other exception is a bug in megavm.
"""


class MegavmError(Exception):
    pass


class UserError(MegavmError, ValueError):
    """Bad input from a user or a file; the message names it."""


class InputError(UserError):
    """A runtime input (token id, position) is outside what the program can take; nothing was run."""


class ConfigError(UserError):
    """A model config that megavm cannot lower; the message names the field and its value."""


class CheckpointError(UserError):
    """A folder that is not a checkpoint megavm can load; the message names the file or tensor."""


class BuildError(MegavmError):
    """The megakernel could not be compiled or loaded (nvcc missing or failing, no GPU, stale sources)."""


class RunError(MegavmError):
    """A run of a program failed."""


class DeadlockError(RunError):
    """No queue head can run and the program is not finished."""


class RaceError(RunError):
    """Checking mode saw an access out of program order: a read before all its writers finished, or a
    write while an older value still had unfinished readers."""


class DeviceError(RunError):
    """The megakernel aborted (wait timeout, unknown opcode, bad input) and reported a dump."""

    def __init__(self, message: str, dump: dict | None = None):
        super().__init__(message)
        self.dump = dump or {}
