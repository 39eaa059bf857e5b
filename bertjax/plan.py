"""python -m bertjax.plan --config=configs/large.py --topology=v5p-128: see the pod before you rent it.

Compiles the real train step ahead of time for a Cloud TPU slice, on this (CPU) machine, with the
`libtpu` package (pip install libtpu; the version jax[tpu] pins), and prints per chip: parameter,
optimizer-state, batch and temporary memory against the chip's HBM, whether it fits, the step's FLOPs
(the compiler's count and the model formula), the collectives in the compiled step, and an MFU bound.
Nothing is allocated: the state and the batch are abstract (shapes and shardings only).

  python -m bertjax.plan --config=configs/large.py --topology=v5p-128 --config.mesh.fsdp=-1 \
      --config.mesh.data=1 --config.train.batch_size=1024 [--find_max_batch] [--json] [--require_fit]

On a GPU machine, --topology=local plans for the devices the program runs on (their allocator's memory
limit), and --choose_layout picks the fastest layout of the stack that fits before any batch search:

  python -m bertjax.plan --config=configs/large.py --topology=local --choose_layout --find_max_batch

Topology names are Cloud TPU's: v4-N and v5p-N count TensorCores (2 per chip), v5e-N (or v5litepod-N)
and v6e-N count chips. "Does not fit" is a result, not an error (exit 0) unless --require_fit.
"""

import sys

from absl import flags
from ml_collections import config_flags

from bertjax.bench import tpu_plan
from bertjax.runs import console


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
        topology=flags.DEFINE_string("topology", None, "Cloud TPU slice, e.g. v4-32, v5e-256, v5p-128, v6e-64."),
        find_max_batch=flags.DEFINE_bool("find_max_batch", False, "Also search the largest batch per data-parallel "
                                         "device that fits (doubling, then bisection; one compile per try)."),
        start=flags.DEFINE_integer("start_batch", None, "Where --find_max_batch starts: sequences per data-parallel "
                                   "device (default: the config's batch)."),
        bisect=flags.DEFINE_integer("bisect_steps", 3, "Bisection steps after doubling in --find_max_batch."),
        json=flags.DEFINE_bool("json", False, "Print the plan as one JSON object instead of the table."),
        require_fit=flags.DEFINE_bool("require_fit", False, "Exit 1 when the step does not fit the chip's HBM."),
        choose_layout=flags.DEFINE_bool("choose_layout", False, "First choose the fastest layout of the stack that "
                                        "fits (unrolled without remat, then remat and scanned layers), and plan "
                                        "with it; prints the --config.model overrides."),
        memory_gib=flags.DEFINE_float("memory_gib", None, "--topology=local: memory per device, where the device "
                                      "reports none (a CPU); default: the allocator's limit on a GPU."),
    )


def main(argv, args):
    console.no_arguments(argv)
    fits = console.finish(tpu_plan.plan_and_print, args.config, args.topology, search=args.find_max_batch,
                          start_batch=args.start, bisect_steps=args.bisect, as_json=args.json,
                          layout=args.choose_layout, memory_gib=args.memory_gib)
    if args.require_fit and not fits:
        print("does not fit (--require_fit)", file=sys.stderr)
        sys.exit(1)


def entry():
    """The console script's entry point (pyproject.toml)."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
