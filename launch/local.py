"""Run N processes of one command on this machine as one multi-process JAX job.

    python launch/local.py --num_processes=2 --cpu -- \\
        python -m bertjax.train --config=configs/tiny.py --workdir=/tmp/bertjax-2proc

Each child gets the variables bertjax.training.sharding.initialize_distributed reads:
BERTJAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>, BERTJAX_NUM_PROCESSES=N, BERTJAX_PROCESS_ID=i.
Its output lines come back prefixed with "[i] " (stdout to stdout, stderr to stderr).

What it is for: exercising the multi-process code paths (host data shares, global arrays built from
per-process pieces, process-0-only writing, checkpoints written by several processes, preemption
agreed across processes) on one machine, before a pod or a cluster. One process already drives all of
a machine's accelerators; several processes on one machine are for testing, not for speed.

Options:
  --num_processes=N        processes to start (required)
  --cpu                    run on the CPU: JAX_PLATFORMS=cpu, and --devices_per_process virtual CPU
                           devices per process (XLA_FLAGS=--xla_force_host_platform_device_count)
  --devices_per_process=K  with --cpu, virtual devices per process (default 1); without --cpu, process i
                           is given GPUs i*K .. i*K+K-1 through CUDA_VISIBLE_DEVICES
  --timeout=SECONDS        stop everything (SIGTERM, then SIGKILL) after this long and exit 124
  --grace_period=SECONDS   how long stopped children get between SIGTERM and SIGKILL (default 30)

Failure and signals:
  - when a child exits non-zero, the others are stopped (SIGTERM, SIGKILL after --grace_period: the
    survivors would otherwise wait for the dead peer in their next collective) and the launcher exits
    with the failed child's code (128 + signal number for a child killed by a signal);
  - SIGTERM or SIGINT (Ctrl-C) to the launcher is passed on to every child as SIGTERM, which bertjax.train
    answers by saving a checkpoint and exiting 0, so a preempted launcher leaves a resumable workdir.
    A second signal kills the children (SIGKILL).
Children run in their own sessions, so a terminal's Ctrl-C reaches them only through the launcher (as
the SIGTERM above, not as a KeyboardInterrupt that would skip the save); on Linux they are also killed
if the launcher itself dies without cleaning up (SIGKILL), instead of holding the coordinator port.

Standard library only, so that it runs before anything is installed.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# Exit status when --timeout expires, as timeout(1) uses.
TIMEOUT_EXIT = 124
POLL_SECONDS = 0.1


def free_port() -> int:
    """A TCP port nothing listens on now. Another program could take it before the coordinator binds
    it; on a test machine that race is rare enough, and the job then fails loudly at start-up."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict, *, process_id: int, num_processes: int, coordinator: str, cpu: bool,
              devices_per_process: int | None) -> dict:
    env = dict(base)
    env["BERTJAX_COORDINATOR_ADDRESS"] = coordinator
    env["BERTJAX_NUM_PROCESSES"] = str(num_processes)
    env["BERTJAX_PROCESS_ID"] = str(process_id)
    # Output must arrive line by line, not when a child's buffer happens to fill.
    env["PYTHONUNBUFFERED"] = "1"
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
        # Replace, not append to, an inherited device count (pytest's conftest sets 8): XLA would
        # otherwise see two values of the flag.
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={devices_per_process or 1}")
        env["XLA_FLAGS"] = " ".join(flags)
    elif devices_per_process:
        # Without a slice each process would claim every GPU of the machine.
        first = process_id * devices_per_process
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in range(first, first + devices_per_process))
    return env


def parent_death_signal():
    """A preexec_fn (Linux) after which the kernel sends the child SIGKILL when the launcher dies, even
    by SIGKILL, so that no orphan keeps training or holding the port; None where there is no prctl.
    prctl is looked up here, before any fork: the child of a threaded process should run as little
    Python as possible (no imports) before it execs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _relay(stream, out, prefix: bytes, lock: threading.Lock) -> None:
    """Copy a child's pipe to our stdout/stderr line by line with its prefix. Bytes, not text: a child
    printing invalid UTF-8 must not kill the relay (and with it the child, on a full pipe)."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


class Job:
    """The children, their output relays, and stopping them."""

    def __init__(self, command: list[str], num_processes: int, *, cpu: bool, devices_per_process: int | None):
        coordinator = f"127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen] = []
        self.relays: list[threading.Thread] = []
        lock = threading.Lock()
        preexec = parent_death_signal()
        for i in range(num_processes):
            env = child_env(os.environ, process_id=i, num_processes=num_processes, coordinator=coordinator,
                            cpu=cpu, devices_per_process=devices_per_process)
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec)
            self.procs.append(proc)
            prefix = f"[{i}] ".encode()
            for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_relay, args=(stream, out, prefix, lock), daemon=True)
                t.start()
                self.relays.append(t)

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def signal_all(self, sig: int) -> None:
        """To each running child's whole process group: a child that is a shell passes nothing on."""
        for p in self.running():
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:  # exited in the meantime
                pass

    def stop(self, grace_period: float) -> None:
        """SIGTERM, then SIGKILL whatever is left after the grace period."""
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_period
        while self.running() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if self.running():
            print(f"launch/local.py: children still running {grace_period:g}s after SIGTERM: SIGKILL", file=sys.stderr,
                  flush=True)
            self.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def finish_output(self) -> None:
        # A grandchild that inherited a pipe could keep it open forever: do not wait on it for long.
        for t in self.relays:
            t.join(timeout=5)


def exit_code(returncode: int) -> int:
    """A child's status as a shell reports it: killed by signal S -> 128 + S."""
    return 128 - returncode if returncode < 0 else returncode


def run(command: list[str], num_processes: int, *, cpu: bool = False, devices_per_process: int | None = None,
        timeout: float | None = None, grace_period: float = 30.0) -> int:
    received: list[int] = []
    job: Job | None = None

    def forward() -> None:
        # The first signal asks the children to stop (bertjax.train saves); any later one kills them.
        if len(received) == 1:
            # os.write, not print: a handler may interrupt a print of the main thread on the same stream.
            os.write(2, f"launch/local.py: got {signal.Signals(received[0]).name}: passing SIGTERM to the "
                        f"children (signal again to kill them)\n".encode())
            job.signal_all(signal.SIGTERM)
        else:
            job.signal_all(signal.SIGKILL)

    def on_signal(signum, frame):
        received.append(signum)
        # Passed on at once, not at the next poll: a preemption notice leaves little time to save.
        if job is not None:
            forward()

    # Installed before the children start, so that a signal in between is not lost (it is passed on
    # as soon as they exist).
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            job = Job(command, num_processes, cpu=cpu, devices_per_process=devices_per_process)
        except OSError as e:  # not found, not executable: the same for every process, so none started
            print(f"launch/local.py: cannot start {command[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
            return 127 if isinstance(e, FileNotFoundError) else 126
        if received:
            forward()
        deadline = None if timeout is None else time.monotonic() + timeout
        status = 0
        while job.running():
            failed = [p for p in job.procs if p.returncode not in (None, 0)]
            if failed:
                status = exit_code(failed[0].returncode)
                print(f"launch/local.py: process {job.procs.index(failed[0])} exited with status {status}: "
                      f"stopping the others", file=sys.stderr, flush=True)
                job.stop(grace_period)
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"launch/local.py: --timeout={timeout:g}s reached: stopping every process", file=sys.stderr,
                      flush=True)
                job.stop(grace_period)
                job.finish_output()
                return TIMEOUT_EXIT
            time.sleep(POLL_SECONDS)
        job.finish_output()
        if status == 0:
            # Everything has ended: report the first failure in process order, if any.
            status = next((exit_code(p.returncode) for p in job.procs if p.returncode != 0), 0)
        return status
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python launch/local.py --num_processes=N [--cpu] [--devices_per_process=K] "
                         "[--timeout=S] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --num_processes=N [options] -- COMMAND ...")
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--devices_per_process", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--grace_period", type=float, default=30.0)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    if args.num_processes < 1:
        parser.error(f"--num_processes={args.num_processes} must be at least 1")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        parser.error(f"--devices_per_process={args.devices_per_process} must be at least 1")
    return args, command


def main(argv: list[str]) -> int:
    args, command = parse_args(argv)
    return run(command, args.num_processes, cpu=args.cpu, devices_per_process=args.devices_per_process,
               timeout=args.timeout, grace_period=args.grace_period)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
