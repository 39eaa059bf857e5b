"""A new phase of a run: the model train.init_from names (or distill.teacher), read once; checked against the
config; its parameters (a learned position table tiled where the new one is longer) and optimizer state
(its schedule restarted); the line that says what changed from its run; and its vocabulary for the data.
What runs/pretraining.py's restore and general distillation call.
"""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import traverse_util

from bertjax import init_from
from bertjax.interop import hf, hf_electra
from bertjax.models.config import ARCHITECTURE_FIELDS, PHASE_FIELDS, BertConfig, fields_of
from bertjax.runs.console import say
from bertjax.text import files
from bertjax.training import checkpoint
from bertjax.training import workdir as workdirs


def read_parent(path: str | None, config, what: str, tokenizer: bool | None = None) -> init_from.Start | None:
    """The model `path` names (train.init_from, distill.teacher), read once; None for none. An ELECTRA pair
    of Hugging Face directories (discriminator/, generator/) is read as its discriminator, the one that
    holds the tokenizer and the network checked against the config. Its tokenizer is looked for where
    `tokenizer` says, by default where the run reads text without a vocabulary of its own
    (with_model_vocabulary)."""
    if not path:
        return None
    data = config.data
    if tokenizer is None:
        tokenizer = not data.vocab_path and data.source not in ("synthetic", "prepared")
    if hf_electra.is_pair(path):
        path = str(hf_electra.Path(path) / hf_electra.DISCRIMINATOR_DIR)
    return init_from.resolve(path, what, tokenizer=tokenizer)


def optimizer_kind(name: str | None) -> str | None:
    """What an optimizer's state holds: decoupled weight decay changes the step, not the state."""
    return name.removeprefix("decoupled_") if name else name


def check_parent(parent: init_from.Start, config, bert_config: BertConfig, electra: bool = False) -> None:
    """Everything about train.init_from that can be checked from its config alone, each a one-line error:
    the architecture this config's (a phase may change PHASE_FIELDS), a learned position table of this
    length or train.extend_positions=copy, and for train.init_from_optimizer a bertjax run whose
    optimizer is of this config's kind."""
    path, stored = config.train.init_from, parent.config
    differ = [f"{field}={getattr(stored, field)!r} but the config has model.{field}="
              f"{getattr(bert_config, field)!r}" for field in ARCHITECTURE_FIELDS
              if field not in PHASE_FIELDS and getattr(stored, field) != getattr(bert_config, field)]
    if differ:
        raise ValueError(f"train.init_from={path} has {'; '.join(differ)}")
    rows, extend = stored.max_position_embeddings, config.train.get("extend_positions", "none")
    if bert_config.position_embedding == "learned" and rows != bert_config.max_position_embeddings and (
            extend == "none" or electra):
        copy = "" if electra else ", or train.extend_positions=copy to tile its rows over the new table"
        raise ValueError(f"train.init_from={path} has a learned position table of {rows} rows, the config "
                         f"model.max_position_embeddings={bert_config.max_position_embeddings}: set "
                         f"model.max_position_embeddings={rows}{copy}")
    if config.train.get("init_from_optimizer"):
        if not parent.is_bertjax_run:
            raise ValueError(f"train.init_from={path} is not a bertjax run, so it has no optimizer state to carry: set "
                             "train.init_from_optimizer=False")
        saved = (parent.meta.optimizer or {}).get("name")
        if optimizer_kind(saved) != optimizer_kind(config.optimizer.name):
            raise ValueError(f"train.init_from={path} trained with optimizer.name={saved!r}, whose state is not "
                             f"{config.optimizer.name!r}'s: set optimizer.name={saved!r}, or "
                             "train.init_from_optimizer=False for the parameters only")


def parent_config(parent: init_from.Start) -> dict | None:
    """The config the bertjax run `parent` (train.init_from) ran with: its checkpoint's record, else its
    workdir's config.json (older checkpoints); None where neither is."""
    if parent.meta.config is not None:
        return parent.meta.config
    written = files.path(files.join(checkpoint.workdir_of(parent.checkpoint), workdirs.CONFIG_FILE))
    return json.loads(written.read_text()) if written.exists() else None


def flat_values(config: dict, prefix: str = "") -> dict:
    """{"data": {"seed": 0}} -> {"data.seed": 0}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_values(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(parent: dict, config) -> list[str]:
    """"data.max_seq_length 1024 -> 8192" for each key whose value differs from the parent run's (keys the
    parent's version did not have, train.init_from itself, and data.vocab_path left unset, which then reads
    the parent's vocabulary: with_model_vocabulary, left out)."""
    def shown(value):
        return f"{value:g}" if isinstance(value, float) else "''" if value == "" else str(value)

    before = flat_values(parent)
    now = flat_values(json.loads(json.dumps(config.to_dict(), default=str)))  # as the parent's came back from JSON
    return [f"{key} {shown(before[key])} -> {shown(value)}" for key, value in sorted(now.items())
            if key in before and key != "train.init_from" and before[key] != value
            and not (key == "data.vocab_path" and value is None)]


def phase_line(parent: init_from.Start, config) -> str | None:
    """The start's one line about a bertjax run's train.init_from: every config change from its run."""
    if not parent.is_bertjax_run:
        return None
    path, recorded = parent.path, parent_config(parent)
    if recorded is None:
        return f"phase from {path}: its run recorded no config to compare with"
    changes = config_changes(recorded, config)
    return f"phase from {path}: " + (", ".join(changes) if changes else "the config is its run's")


def initial_params(parent: init_from.Start, bert_config: BertConfig, abstract_params, extend_positions: str = "none"):
    """Parameters only, through the one init-from, restored straight into the state's shardings; their
    architecture is this config's (check_parent), how they are stored and computed may differ. A learned
    position table of another length is tiled over this config's (extend_positions="copy")."""
    path = parent.path
    overrides = fields_of(bert_config, "layout", "compute")
    resized = (bert_config.position_embedding == "learned" and extend_positions == "copy"
               and parent.config.max_position_embeddings != bert_config.max_position_embeddings)
    model = init_from.load(parent, model_overrides=overrides, abstract_params=None if resized else abstract_params)
    if model.missing:
        logging.info("initialised fresh (not in %s): %s", path, model.missing)
    if not resized:
        return model.params
    params = traverse_util.flatten_dict(jax.device_get(model.params))
    for key, table in params.items():
        if key[-2:] == ("position_embeddings", "embedding"):
            params[key] = copied_positions(table, bert_config.max_position_embeddings, bert_config.position_offset)
            say(f"position table of {path}: its {table.shape[0]} rows tiled over {params[key].shape[0]} "
                "(train.extend_positions=copy)")
    return jax.device_put(traverse_util.unflatten_dict(params),
                          jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))


def copied_positions(table: np.ndarray, rows: int, offset: int = 0) -> np.ndarray:
    """A learned position table [P, E] made `rows` long: its first `offset` rows (RoBERTa's, before the
    first position) kept, then the positions it learned repeated (Longformer's copy: each block of
    positions starts as the trained ones, so the model reads the first tokens of a long row as before)."""
    learned = table[offset:]
    repeats = -(-(rows - offset) // len(learned))
    return np.concatenate([table[:offset], np.tile(learned, (repeats, 1))[:rows - offset]]).astype(table.dtype)


def restarted_schedule(opt_state):
    """opt_state with every learning-rate schedule's count (optax's ScaleByScheduleState) at 0: a new
    phase runs its own schedule from its start. The moments' own count stays: it is their bias
    correction (StableAdamW's debiased betas would discard the carried moments at a count of 0)."""
    def restart(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.zeros_like(node.count))
        return node

    return jax.tree_util.tree_map(restart, opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState))


def electra_initial_params(path: str, parent: init_from.Start, setup, fresh):
    """ELECTRA's continued pretraining: from an ELECTRA run's workdir or checkpoint (both networks), a pair
    of Hugging Face directories at `path` (discriminator/ and generator/, as the hf export writes them;
    `parent` is the discriminator's) or an ELECTRA discriminator's directory alone (the generator then
    starts fresh, said in one line)."""
    if parent.is_bertjax_run:
        if parent.meta.electra is None:
            raise ValueError(f"train.init_from={path} is not an ELECTRA run: start ELECTRA from one, from an ELECTRA "
                             "discriminator's Hugging Face directory, or from scratch")
        return checkpoint.restore_params(parent.checkpoint, setup.abstract_state.params)[0]
    disc_state, gen_state, disc_hf, gen_hf = hf_electra.read_pair(path)
    differ = [f"{k}={v!r} but the config has model.{k}={getattr(setup.bert_config, k)!r}"
              for k, v in fields_of(hf.config_from_hf(disc_hf), "architecture").items()
              if v != getattr(setup.bert_config, k)]
    if gen_hf is not None:
        own = lambda key: getattr(setup.generator_config, key.removeprefix("generator_"))  # noqa: E731
        differ += [f"the generator's {k.removeprefix('generator_')}={v!r} but the config has electra.{k}={own(k)!r}"
                   for k, v in hf_electra.generator_fields(gen_hf).items() if v != own(k)]
    if differ:
        raise ValueError(f"train.init_from={path} has {'; '.join(differ)}")
    if gen_state is None:
        say(f"train.init_from={path} is a discriminator alone: the generator starts fresh")
    params, _ = hf_electra.pair_from_hf(disc_state, gen_state, setup.bert_config, setup.generator_config,
                                        jax.device_get(fresh))
    return jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, setup.abstract_state.params))


def with_model_vocabulary(config, start: init_from.Start | None):
    """config with the vocabulary of the model `start` (train.init_from, distill.teacher) as data.vocab_path,
    where that is unset and the data is text; as it is otherwise. Continued pretraining (and a distilled
    student) must read text with the starting model's own tokenizer: a vocabulary learned anew would give
    its embeddings other tokens' ids."""
    data = config.data
    if start is None or data.vocab_path or data.source in ("synthetic", "prepared"):
        return config
    tokenizer = start.tokenizer
    if tokenizer is None:
        return config
    say(f"tokenizer: the vocabulary of {start.path} ({tokenizer.kind})")
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.update(vocab_path=tokenizer.vocab_path, tokenizer=tokenizer.kind, lower_case=tokenizer.lower_case)
    return config
