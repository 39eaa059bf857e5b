"""Every value of a run's config checked before anything heavy is built: no process joined, no mesh, no
model, no file written. A mistake is one line naming the key and what to change; each kind of run calls
its check first, and `--dry_run` stops after it, printing the config as the run would use it.

The model section is checked as a CPU would resolve its "auto" fields (asking JAX for the platform would
start its backend before the processes of a run have joined); the platform's own choices are checked
again, as always, where the model is built.
"""

import ml_collections
from etils import epath

from bertjax.data import backends, units
from bertjax.data.settings import DataSettings
from bertjax.models.config import BertConfig
from bertjax.training import optim
from bertjax.training.state import DROPOUT_RNGS


def check_pretraining(config, *, steps_may_be_zero: bool = False) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A pretraining (or general distillation) config, checked, and the lines to say once the run has
    started: returned with a warmup longer than the run fitted to it (and a line saying so)."""
    model = BertConfig.from_dict(config.model, platform="cpu")
    data = DataSettings.from_config(config.data)
    backends.check_inputs(data)
    units.check(data)
    if config.get("electra") is not None:
        check_electra(config.electra, model, data.objective)
    check_train(config.train, steps_may_be_zero=steps_may_be_zero)
    check_batch_warmup(config.train, data.mask_rate_schedule)
    check_path(config.train.init_from, "train.init_from")
    check_phase(config.train)
    config, notes = fitted_warmup(config)
    if config.train.num_steps:
        optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
    return config, notes


ELECTRA_KEYS = ("generator_hidden_size", "generator_num_layers", "generator_num_heads", "generator_intermediate_size",
                "discriminator_weight")


def check_electra(electra, model: BertConfig, objective: str) -> None:
    """The electra section: a generator no wider than the discriminator, of a shape it can have."""
    missing = [k for k in ELECTRA_KEYS if k not in electra]
    if missing:
        raise ValueError(f"the electra section lacks {', '.join('electra.' + k for k in missing)}: see "
                         "configs/electra_small.py")
    for key in ELECTRA_KEYS[:4]:
        if not isinstance(electra[key], int) or electra[key] < 1:
            raise ValueError(f"electra.{key}={electra[key]!r} must be a positive whole number")
    hidden, heads = electra.generator_hidden_size, electra.generator_num_heads
    if hidden > model.hidden_size:
        raise ValueError(f"electra.generator_hidden_size={hidden} is wider than the discriminator's model.hidden_size="
                         f"{model.hidden_size}: ELECTRA's generator is 1/4 to 1/3 of it (e.g. "
                         f"{model.hidden_size // 4})")
    if hidden % heads:
        raise ValueError(f"electra.generator_hidden_size={hidden} is not divisible by "
                         f"electra.generator_num_heads={heads}")
    if not electra.discriminator_weight > 0:
        raise ValueError(f"electra.discriminator_weight={electra.discriminator_weight!r} must be > 0 (the paper: 50)")
    if objective != "none":
        raise ValueError(f"data.objective={objective!r}: ELECTRA has no sentence task, set data.objective=none")


def check_finetuning(config) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A fine-tuning (or pruning) config: the model's compute fields, the train section, the starting model."""
    check_model_overrides(config.model)
    check_train(config.train)
    for name in ("train", "validation", "test"):  # the user's files first: the likeliest slip
        check_path(config.data.get(name), f"data.{name}")
    predecessor = config.get("theseus") and config.theseus.predecessor
    if predecessor:  # module replacing: the successor starts from the predecessor, which stands for init_from
        check_path(predecessor, "theseus.predecessor")
        if (config.train.init_from or config.get("init_from")) not in (None, "", predecessor):
            raise ValueError("theseus.predecessor is where the successor starts (its first theseus.successor_layers "
                             "layers, the paper's initialisation): unset train.init_from")
        config = ml_collections.ConfigDict(config.to_dict())
        config.train.init_from = predecessor
    if not (config.train.init_from or config.get("init_from")):
        raise ValueError("config.train.init_from is required: a bertjax pretraining workdir or checkpoint, a params "
                         "export, or a Hugging Face directory")
    check_path(config.train.init_from or config.init_from, "train.init_from")
    return config, []


def check_train(train, *, steps_may_be_zero: bool = False) -> None:
    for key in ("batch_size", "grad_accum_steps"):
        if not isinstance(train[key], int) or train[key] < 1:
            raise ValueError(f"train.{key}={train[key]!r} must be a positive whole number")
    if train.batch_size % train.grad_accum_steps:
        raise ValueError(f"train.batch_size={train.batch_size} must divide by train.grad_accum_steps="
                         f"{train.grad_accum_steps} (each microbatch the same size)")
    if "num_steps" in train and (not isinstance(train.num_steps, int) or train.num_steps < (0 if steps_may_be_zero
                                                                                          else 1)):
        raise ValueError(f"train.num_steps={train.num_steps!r} must be a positive whole number")
    if train.dropout_rng not in DROPOUT_RNGS:
        raise ValueError(f"train.dropout_rng={train.dropout_rng!r}: choose one of {DROPOUT_RNGS}")


def check_batch_warmup(train, mask_rate_schedule=()) -> None:
    """train.batch_warmup_start and _steps: whole microbatches, below the batch, over a positive number of
    steps (training/batch_warmup.py)."""
    start, steps = train.get("batch_warmup_start", 0), train.get("batch_warmup_steps", 0)
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"train.batch_warmup_start={start!r} must be a whole number of sequences (0: no warmup)")
    if not start:
        return
    micro = train.batch_size // train.grad_accum_steps
    if start % micro:
        raise ValueError(f"train.batch_warmup_start={start} is not a whole number of microbatches of {micro} sequences "
                         f"(train.batch_size={train.batch_size} / train.grad_accum_steps={train.grad_accum_steps}): "
                         f"set it to a multiple of {micro}, or raise train.grad_accum_steps for a smaller microbatch")
    if start >= train.batch_size:
        raise ValueError(f"train.batch_warmup_start={start} must be below train.batch_size={train.batch_size}, the "
                         "batch it grows to: lower it, or set it to 0 for no warmup")
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"train.batch_warmup_steps={steps!r} must be a positive number of steps with "
                         f"train.batch_warmup_start={start}: set the steps the batch grows over, or "
                         "train.batch_warmup_start=0 for no warmup")
    if mask_rate_schedule:
        raise ValueError("data.mask_rate_schedule changes the rate by step, which a batch-size warmup does not map to "
                         "examples yet: set train.batch_warmup_start=0, or data.mask_rate_schedule=()")


EXTEND_POSITIONS = ("none", "copy")


def check_phase(train) -> None:
    """A new phase of a run (train.init_from_optimizer, extend_positions, continues): the keys' values,
    and the parent run that a continuing recipe needs."""
    extend = train.get("extend_positions", "none")
    if extend not in EXTEND_POSITIONS:
        raise ValueError(f"train.extend_positions={extend!r}: choose one of {EXTEND_POSITIONS}")
    if train.get("continues") and not train.init_from:
        raise ValueError(f"this recipe continues a run of {train.continues}: set --config.train.init_from=<that "
                         "run's workdir>")
    if train.get("init_from_optimizer") and not train.init_from:
        raise ValueError("train.init_from_optimizer=True carries the optimizer state of train.init_from's run: set "
                         "train.init_from to its workdir, or train.init_from_optimizer=False")


def check_model_overrides(model) -> None:
    """A fine-tuning config's model section sets how the pretrained network computes: each value checked
    on a default network (the architecture comes from the starting model)."""
    BertConfig.from_dict(dict(model), platform="cpu")
    if model.get("matmul_dtype") == "fp8":  # the task steps apply params alone; no scaling state reaches them
        raise ValueError("model.matmul_dtype=fp8 trains in pretraining only: set model.matmul_dtype=default "
                         "(a checkpoint pretrained in fp8 fine-tunes as it is)")


def check_path(path: str | None, key: str) -> None:
    if path and not epath.Path(path).exists():
        raise FileNotFoundError(f"{key}={path} does not exist")


def fitted_warmup(config) -> tuple[ml_collections.ConfigDict, list[str]]:
    """A recipe's warmup longer than this run (a 20-step try of a config that warms up over 60) becomes a
    tenth of the run, with a line saying so; the run's config.json records what was used."""
    warmup, steps = config.schedule.warmup_steps, config.train.num_steps
    if not steps or warmup <= steps:
        return config, []
    fitted = max(1, steps // 10)
    note = (f"schedule.warmup_steps={warmup} is longer than this run's train.num_steps={steps}: warming up over "
            f"{fitted} step(s) instead (a tenth of the run); set --config.schedule.warmup_steps to choose")
    config = ml_collections.ConfigDict(config.to_dict())
    config.schedule.warmup_steps = fitted
    return config, [note]


def flattened(config, prefix: str = "") -> list[str]:
    """The config as `section.key=value` lines: what --config.section.key=value on the command line sets."""
    lines = []
    for key, value in sorted(config.items()):
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            lines += flattened(value, name + ".")
        else:
            lines.append(f"{name}={value!r}")
    return lines


def dry_run(check, config) -> None:
    """--dry_run: the config checked as the run would check it, then printed, one key a line."""
    config, notes = check(config)
    print("\n".join(notes + flattened(config)))
    print("--dry_run: the config is valid; nothing was built or written")
