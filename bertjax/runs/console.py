"""The console of a run and of the programs that start one: lines for the person running it (`say`),
flag parsing that turns a bad flag or an unknown --config.key into one line that says what to change,
and the one mapping of how a run ends to how its program exits (`finish`, then `exit_without_teardown`).

How a run ends, whatever its kind:
  - it returns: done, exit 0;
  - runs.start.Stopped: SIGTERM or Ctrl-C asked it to stop and it saved first: the run has said so,
    exit 0 after SIGTERM (asked to stop, and did) or 130 after Ctrl-C;
  - ValueError, OSError (a missing file, a full disk), FloatingPointError: something the user can change,
    one line, exit 2;
  - KeyboardInterrupt outside the steps (which alone turn Ctrl-C into a save): exit 130.
"""

import atexit
import logging as pylogging
import os
import sys
import threading
from types import SimpleNamespace
from typing import Any, Callable, NoReturn

import jax
from absl import app, flags, logging

import configs
from bertjax.runs.start import Distributed, Stopped


def say(message: str) -> None:
    """A line for the person running the job, from process 0 only (library INFO logs stay off)."""
    if jax.process_index() == 0:
        print(message, flush=True)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags_parser for app.run: like the default, but a mistake exits 2 with one clear line."""
    try:
        rest = flags.FLAGS(argv)
        if "config" in flags.FLAGS:
            # The config file is loaded lazily by ml_collections; load it now so a missing or broken
            # file is reported here, once, and not as a traceback from deep inside the program.
            config = flags.FLAGS["config"].value
            if config is None:
                fail("--config is required, e.g. --config=configs/tiny.py")
            config.keys()  # a stand-in for a config that failed to load raises OSError here
        return rest
    except OSError as e:
        given = " ".join(a for a in argv[1:] if "config=" in a)
        installed = os.path.dirname(configs.__file__)
        choices = sorted(f for f in os.listdir(installed) if f.endswith(".py") and not f.startswith("_"))
        fail(str(e).splitlines()[-1].strip() + f" (from {given}): a file of configs/ (here or installed with "
             f"bertjax: {', '.join(c.removesuffix('.py') for c in choices if c != 'common.py')}; finetune/, "
             f"distill/), or a path to your own")
    except flags.Error as e:
        fail(str(e))
    except (AttributeError, KeyError) as e:
        # ml_collections reports an override of a key the config does not have this way, its message
        # being "'key'" and, when it has one, a line "Did you mean ...".
        inner = e
        while inner.args and isinstance(inner.args[0], BaseException):  # AttributeError(KeyError(...))
            inner = inner.args[0]
        text = str(inner.args[0]) if inner.args else str(inner)
        lines = [line.strip() for line in text.strip().strip("\"").splitlines() if line.strip()]
        key = lines[0].strip("'\"") if lines else "?"
        hint = next((line for line in lines[1:] if line.lower().startswith("did you mean")), "")
        flag = " ".join(a for a in argv[1:] if a.startswith("--config.") and key in a) or "the command line"
        fail(f"unknown config key {key!r} in {flag}" + (f" ({hint.rstrip('?')}?)" if hint else "")
             + ": check the spelling against the config file (--dry_run prints every key of the config)")
    except (TypeError, ValueError) as e:
        fail(f"bad config override: {e}")


def fail(message: str):
    """One line on stderr that says what to change, then exit code 2."""
    print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {message}", file=sys.stderr)
    sys.exit(2)


def quiet_library_logs() -> None:
    """Library INFO logs off unless --verbosity is given (Orbax and JAX log every checkpoint file at
    INFO; --verbosity=0 brings them back), and a failed background save's tracebacks dropped: Orbax's
    thread logs it, and asyncio each of its writes whose failure nobody awaited, while the program
    reports it itself in one line (checkpoint.SaveFailed)."""
    if flags.FLAGS["verbosity"].present:
        return
    logging.set_verbosity(logging.WARNING)
    logging.get_absl_handler().addFilter(
        lambda record: not (record.levelno >= pylogging.ERROR
                            and ("/orbax/" in record.pathname
                                 or (record.name == "asyncio" and "never retrieved" in record.getMessage()))))


def define_dry_run_flag() -> dict:
    return dict(dry_run=flags.DEFINE_bool("dry_run", False, "Check the config (every value, the inputs it names) "
                                          "and print it as the run would use it, one key a line; build nothing."))


def define_distributed_flags() -> dict:
    """The flags that name the other processes of a run (launch/ sets them, or the BERTJAX_* variables)."""
    return dict(
        coordinator_address=flags.DEFINE_string("coordinator_address", None,
                                                "host:port of process 0, for several processes."),
        num_processes=flags.DEFINE_integer("num_processes", None, "How many processes take part."),
        process_id=flags.DEFINE_integer("process_id", None, "This process's index."),
    )


def distributed(args) -> Distributed:
    """The Distributed of a program's flag values (define_distributed_flags)."""
    return Distributed(args.coordinator_address, args.num_processes, args.process_id)


def no_arguments(argv: list[str]) -> None:
    """Programs take flags only: a stray word on the command line is a usage error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def finish(run: Callable[..., Any], *args, **kwargs) -> Any:
    """run(*args, **kwargs) as a program's one call: its result when it completes, otherwise the exit
    its ending calls for (the module docstring lists them)."""
    quiet_library_logs()
    try:
        return run(*args, **kwargs)
    except (ValueError, OSError, FloatingPointError) as e:
        fail(str(e))
    except Stopped as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("Ctrl-C: stopped; every checkpoint is as it was (a training run resumes from its last one)",
              file=sys.stderr)
        sys.exit(130)


def with_installed_configs(argv: list[str]) -> list[str]:
    """argv with --config=configs/<name>.py[:recipe] pointing at the installed configs package when there is
    no such file here: the README's commands work from any directory, not only the repository's root."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        path, colon, recipe = value.partition(":")
        if flag in ("--config", "-config") and sep and path.startswith("configs/") and not os.path.exists(path):
            installed = os.path.join(os.path.dirname(os.path.dirname(configs.__file__)), path)
            if os.path.exists(installed):
                arg = f"{flag}={installed}{colon}{recipe}"
        out.append(arg)
    return out


def run_program(main: Callable[[list[str], SimpleNamespace], None], define_flags: Callable[[], dict],
                argv: list[str] | None = None) -> None:
    """app.run(main) for a program whose flags are defined only now (importing a program defines none)
    and handed to main as values: main(argv, args), args.<flag> for each flag define_flags returned."""
    holders = define_flags()
    try:
        app.run(lambda argv: main(argv, SimpleNamespace(**{name: h.value for name, h in holders.items()})),
                argv=with_installed_configs(sys.argv if argv is None else argv), flags_parser=parse_flags)
    except SystemExit as stop:
        code = stop.code
    else:
        code = 0
    exit_without_teardown(code)


def exit_without_teardown(code) -> NoReturn:
    """The interpreter's exit, as sys.exit(code) ends a program (other threads joined, at-exit functions
    run, streams flushed), without the teardown of every module after it: with TensorFlow and JAX loaded
    that takes seconds, and a program has nothing left to do in it (its files are closed, its checkpoints
    finished)."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter's exit calls first
    if shutdown is None:
        sys.exit(code)
    # Stops idle thread pools (concurrent.futures registers that here) and joins every other thread.
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(code or 0)
