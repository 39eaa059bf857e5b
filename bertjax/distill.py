"""python -m bertjax.distill: a smaller BERT taught by a pretrained one (general distillation).

    python -m bertjax.distill --config=configs/distill/distilbert.py \
        --config.distill.teacher=/models/bert-base-uncased --workdir=/tmp/distilbert
    python -m bertjax.distill --config=configs/distill/tiny.py --config.distill.teacher=/tmp/teacher \
        --workdir=/tmp/student

DistilBERT's recipe (configs/distill/common.py): the student keeps the teacher's width and starts from
a subset of its layers (distill.student_layers) with its embeddings and heads; it learns the teacher's
masked-LM distribution at a temperature, the masked-LM labels and the direction of the teacher's last
hidden states, on the pretraining stream of the data section. With distill.student_layers=() the student
is config.model, fresh (any width, with distill.alpha_cos=0), or train.init_from's.

Everything else is pretraining's (bertjax/train.py): the mesh, the stream, the loop, checkpoints,
SIGTERM/Ctrl-C and resume. The teacher runs inside the jitted step as an argument in the student's
shardings; it is not trained and not saved. WORKDIR is a pretraining workdir like any other: bertjax.load,
python -m bertjax.finetune (train.init_from) and python -m bertjax.export read it.
"""

import contextlib
import functools
import sys

import flax.linen as nn
import jax
import ml_collections
from absl import app

from bertjax import console, train
from bertjax.compression import distillation
from bertjax.interop import pretrained
from bertjax.models import bert
from bertjax.text import files
from bertjax.training import pretraining, sharding
from bertjax.training import workdir as workdirs
from bertjax.training.state import root_keys

# The model section's fields that say how the student computes, not what it is: a student made of the
# teacher's layers takes these from config.model and the rest from the teacher.
COMPUTE_FIELDS = ("dtype", "attention_impl", "word_embedding", "remat_policy", "scan_layers", "hidden_dropout_rate",
                  "attention_dropout_rate", "initializer_range")


def define_flags() -> dict:
    return train.define_flags()


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    config, workdir = args.config, args.workdir
    if not workdir:
        console.fail("--workdir is required (checkpoints and metrics go there)")
    try:
        sharding.initialize_distributed(args.coordinator_address, args.num_processes, args.process_id)
        files.make(workdir)
        with workdirs.WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
            code = distill(config, workdir)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        console.fail(str(e))
    except KeyboardInterrupt:  # outside the loop, which alone turns Ctrl-C into a save
        print("Ctrl-C outside the training steps: stopped; the last checkpoint stays the one to resume from",
              file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


def distill(config, workdir: str) -> int:
    """The whole run; returns the exit code (0, or 130 when Ctrl-C stopped it after saving)."""
    weights = distillation.LossWeights(**{k: float(config.distill[k]) for k in (
        "temperature", "alpha_ce", "alpha_mlm", "alpha_cos", "alpha_nsp")})
    distillation.check_objective(weights, config.data.objective)
    layers = tuple(int(j) for j in config.distill.student_layers or ())
    if layers and config.train.init_from:
        raise ValueError("distill.student_layers and train.init_from both give the student's starting weights: "
                         "set distill.student_layers=() to start from train.init_from")

    # ---------------------------------------------------------------- mesh
    mesh, rules, data_sharding = train.make_mesh(config)

    # ---------------------------------------------------------------- the teacher
    teacher = load_teacher(config)
    teacher_config = teacher.config
    if layers:  # the student is the teacher's architecture with fewer layers
        config = with_model(config, distillation.student_config_from_teacher(
            teacher_config, layers, bert.resolve_platform({k: config.model[k] for k in COMPUTE_FIELDS})))

    # ---------------------------------------------------------------- the student: shapes first
    init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
    extract_only = config.train.num_steps == 0  # the student as made from the teacher's layers, saved as is
    if extract_only and not layers:
        raise ValueError("train.num_steps=0 saves the student made from the teacher's layers: set "
                         "distill.student_layers, or train.num_steps > 0")
    setup = pretraining.setup(one_step(config) if extract_only else config, mesh, rules, init_key)
    bert_config, abstract_state = setup.bert_config, setup.abstract_state
    bert.check_input_shapes(bert_config, config.data.max_seq_length, config.data.max_predictions_per_seq)
    distillation.check_student(teacher_config, bert_config, weights)
    teacher_net = bert.BertForPreTraining(teacher_config)
    example = bert.dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)
    teacher_params = distillation.place_params(teacher_net, example, teacher.params, mesh, rules)
    train.say(f"teacher: {config.distill.teacher}, {teacher_config.num_layers} layers, hidden "
              f"{teacher_config.hidden_size}, {bert.count_params(teacher_params):,} parameters")
    train.say("student " + train.describe_model(bert_config, abstract_state.params).removeprefix("model: "))

    # ---------------------------------------------------------------- restore: workdir > init_from > layers > scratch
    checkpointer = train.make_checkpointer(config, workdir, abstract_state)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = train.restore(config, setup, checkpointer, init_key, jax.process_count())
        if layers and int(state.step) == 0:  # neither resumed nor from train.init_from
            state = state.replace(params=distillation.student_params(teacher.params, teacher_config, bert_config,
                                                                     layers, abstract_state.params))
            train.say(f"student layers: the teacher's {list(layers)}, with its embeddings and heads")

    # ---------------------------------------------------------------- data: the teacher's vocabulary
    if config.train.init_from:  # a student pretrained on its own must read the same token ids
        own = pretrained.tokenizer_files(config.train.init_from, what="train.init_from")
        theirs = pretrained.tokenizer_files(config.distill.teacher, what="distill.teacher")
        if own is not None and theirs is not None:
            distillation.check_same_vocabulary(own.vocab_path, theirs.vocab_path, "train.init_from")
    config = train.with_model_vocabulary(config, config.distill.teacher, "distill.teacher")
    stream = train.open_stream(config, workdir, bert_config, int(state.step), data_sharding)

    # ---------------------------------------------------------------- jitted steps, the teacher an argument
    objective = config.data.objective
    loss_fn = functools.partial(distillation.pretraining_distillation_loss, net=setup.net, teacher_net=teacher_net,
                                weights=weights, objective=objective)
    p_train_step = distillation.compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding,
                                                          config.train.grad_accum_steps, weights.mean_metrics(objective))
    _, p_eval_step = setup.compile_steps(data_sharding, config.train.grad_accum_steps)  # the student's own MLM eval

    # ---------------------------------------------------------------- loop
    meta = {"distill": {"teacher": str(config.distill.teacher), "student_layers": list(layers)}}
    if extract_only:
        return save_extracted(config, workdir, setup, checkpointer, state, stream, meta)
    return train.run_steps(config, workdir, setup, checkpointer, state, p_train_step, p_eval_step, stream,
                           dropout_key, summarize_window=distillation.summarize, extra_meta=meta)


def load_teacher(config) -> pretrained.Pretrained:
    """distill.teacher through the one init-from, computing as the student does; its masked-LM head must
    be trained (a Hugging Face BertModel without one would teach noise)."""
    path = config.distill.teacher
    if not path:
        raise ValueError("config.distill.teacher is required: a bertjax pretraining workdir or a Hugging Face "
                         "BERT directory with its masked-LM head")
    compute = {k: config.model[k] for k in ("dtype", "attention_impl", "word_embedding", "remat_policy")}
    teacher = pretrained.load(path, what="distill.teacher", model_overrides=compute, tokenizer=False)
    if teacher.task:
        raise ValueError(f"distill.teacher={path} is a fine-tuned {teacher.task.get('kind')} model: general "
                         "distillation needs a pretrained one (task distillation is python -m bertjax.finetune's "
                         "distill section)")
    untrained = [m for m in teacher.missing if "mlm" in m or "predictions" in m]
    if untrained:
        raise ValueError(f"distill.teacher={path} has no trained masked-LM head ({untrained[0]}, ...): give a "
                         "checkpoint with its pretraining heads (BertForPreTraining / BertForMaskedLM)")
    return teacher


def with_model(config, student: bert.BertConfig):
    """config with the model section the student's: what config.json records and a resume checks."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.model = ml_collections.ConfigDict({k: list(v) if isinstance(v, tuple) else v
                                              for k, v in student.__dict__.items()})
    return config


def one_step(config):
    """config with a schedule of one step: an optimizer (whose state the checkpoint holds) needs one."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.num_steps = 1
    config.schedule.update(warmup_steps=0, decay_steps=0)
    return config


def save_extracted(config, workdir: str, setup, checkpointer, state, stream: train.Stream, meta: dict) -> int:
    """train.num_steps=0: the student as made from the teacher's layers, saved as step 0 (DistilBERT's
    initialisation alone, e.g. the baseline a distilled student is compared with)."""
    parts = train.RunHooks(config, setup, None, checkpointer, None, [], stream.tokenizer_meta, jax.process_count(),
                           extra_meta=meta)  # only its save
    parts.save(state, 0, True)
    checkpointer.wait()
    checkpointer.close()
    train.say(f"train.num_steps=0: saved the student as made from the teacher's layers in {workdir}")
    return 0


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
