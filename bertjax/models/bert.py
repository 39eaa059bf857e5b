"""The BERT encoder with its pretraining heads (masked LM and next sentence), in Flax linen.

Faithful to Devlin et al. 2018 and the original TensorFlow release: summed token + segment + learned
position embeddings with LayerNorm (eps 1e-12), post-LN Transformer blocks with exact (erf) GELU, a tanh
pooler on [CLS], and a masked-LM head whose decoder is the transposed word-embedding matrix plus a bias,
evaluated only at the gathered masked positions. The blocks it is built of are in models/layers.py.

Every parameter carries logical axis names and the key activations carry logical constraints; the
config's one rules table (configs/common.py) maps them onto the mesh axes (data, fsdp, tensor).

Shape legend:
  B batch           S sequence length      H hidden size          N attention heads (of a layer)
  D head size H/N   F feed-forward size    P masked-LM predictions per sequence (max_predictions_per_seq)
  V vocabulary      L layers               T segment (token type) vocabulary
  (a pruned model's N differs per layer or ALBERT group, model.layer_heads, and model.head_size gives D)
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import layers

# (layers, hidden) of the published BERT sizes; heads = hidden / 64, feed-forward = 4 * hidden.
# tiny, mini, small, medium: Turc et al. 2019, "Well-Read Students Learn Better" (Table 6 grid).
# base, large: Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers".
SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# Logical axis names used below. Parameters: vocab, embed, mlp, heads, kv, layers (scan axis).
# Activations: batch, length, hidden, heads, mlp, vocab. The hidden size of activations is named
# "hidden" rather than "embed" so that FSDP can shard parameters over "embed" while the batch of the
# activations takes the same mesh axis.

# Activations a remat policy may keep, tagged with jax.ad_checkpoint.checkpoint_name in the block.
#   qkv: the query/key/value projections [B, S, N, D] each    context: attention output [B, S, N, D]
#   attention_out: after the output projection [B, S, H]      mlp_in: feed-forward pre-activation [B, S, F]
#   mlp_out: the feed-forward output [B, S, H]                block_out: the block's output [B, S, H]
CHECKPOINT_NAMES = ("qkv", "context", "attention_out", "mlp_in", "mlp_out", "block_out")

# Activation-rematerialisation policies for nn.remat, by config name.
REMAT_POLICIES = {
    "none": None,
    # Save nothing: recompute the whole block in the backward pass (least memory).
    "full": jax.checkpoint_policies.nothing_saveable,
    # Save every matmul output: recompute only the cheap element-wise work.
    "dots": jax.checkpoint_policies.checkpoint_dots,
    # Save matmul outputs without batch dimensions (the dense layers), recompute attention scores.
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # Save the H-wide and attention tensors, recompute the F-wide (4H) feed-forward activation, the
    # largest per token, from the saved attention output: one F-wide matmul more per layer.
    "save_attention": jax.checkpoint_policies.save_only_these_names("qkv", "context", "attention_out", "mlp_out"),
    # Save every named tensor: recompute only element-wise work (GELU, dropout, LayerNorm).
    "save_named": jax.checkpoint_policies.save_only_these_names(*CHECKPOINT_NAMES),
    # Save only the block outputs: recompute each block once in the backward pass, like "full", but
    # without recomputing the attention projections of the block boundaries twice.
    "save_block_out": jax.checkpoint_policies.save_only_these_names("block_out"),
}

ATTENTION_IMPLS = ("xla", "cudnn", "splash")
POSITION_EMBEDDINGS = ("learned", "rotary", "none")
ACTIVATIONS = ("gelu", "gelu_tanh", "geglu")
NORM_PLACEMENTS = ("post", "pre")
NORMS = ("layernorm", "rmsnorm")
# model.pooler -> whether the per-token heads (span, tagging) apply it at every token too. Both start with a
# dense H->H; "tanh" is BERT's pooler (RoBERTa's and ALBERT's too), "gelu_norm" ModernBERT's prediction head
# (GELU, then the encoder's norm), which its transformers task classes run before every classifier.
POOLERS = {"tanh": False, "gelu_norm": True}
WORD_EMBEDDINGS = ("gather", "one_hot")

# What "auto" means per platform (jax.default_backend()), for the fields that are a matter of speed
# on a given chip and not of the network: bfloat16 compute on accelerators; cuDNN flash attention on
# NVIDIA GPUs (where, as JAX's public API has no dropout for it, attention-probability dropout is off:
# docs/performance.md); the word embedding as a one-hot matmul on TPUs, which prefer it to a gather.
PLATFORM_DEFAULTS = {
    "cpu": dict(dtype="float32", attention_impl="xla", word_embedding="gather"),
    "gpu": dict(dtype="bfloat16", attention_impl="cudnn", word_embedding="gather"),
    "tpu": dict(dtype="bfloat16", attention_impl="xla", word_embedding="one_hot"),
    "rocm": dict(dtype="bfloat16", attention_impl="xla", word_embedding="gather"),  # AMD GPUs: no cuDNN
}


def current_platform() -> str:
    """The key of PLATFORM_DEFAULTS for the backend JAX runs on."""
    backend = jax.default_backend()
    if backend == "gpu" and "rocm" in getattr(jax.devices()[0].client, "platform_version", "").lower():
        return "rocm"
    return backend if backend in PLATFORM_DEFAULTS else "cpu"


def resolve_platform(fields: dict, platform: str | None = None) -> dict:
    """The model fields with every "auto" replaced by PLATFORM_DEFAULTS[platform] (default: the backend
    JAX runs on). cuDNN attention needs 16-bit compute and has no dropout: "auto" picks it only for
    16-bit compute, and then trains without attention-probability dropout."""
    platform = platform or current_platform()
    if platform not in PLATFORM_DEFAULTS:
        raise ValueError(f"platform {platform!r} is unknown: choose one of {sorted(PLATFORM_DEFAULTS)}")
    defaults = PLATFORM_DEFAULTS[platform]
    out = dict(fields)
    auto_attention = out.get("attention_impl") == "auto"
    for name, value in defaults.items():
        if out.get(name) == "auto":
            out[name] = value
    if auto_attention and out["attention_impl"] == "cudnn":
        if jnp.dtype(out.get("dtype", "float32")).itemsize != 2:
            out["attention_impl"] = "xla"
        else:
            out["attention_dropout_rate"] = 0.0
    return out


# What each field of BertConfig is, in one place; every list of fields is derived from these tags.
#   architecture  what the network is: its parameters' shapes and what it computes with them (a resume, an
#                 init_from and a Hugging Face conversion must agree on all of it)
#   layout        how the parameters are stored (a resume must agree; init_from converts)
#   compute       how the network is computed, not what it is: a checkpoint loads under any value
#   training      regularisation and initialisation: a run's own choice, whatever it starts from
ROLES = ("architecture", "layout", "compute", "training")


def _field(default, role: str, family: bool = False):
    """A BertConfig field with its role; family: one of the options that choose a family's network
    (RoBERTa, ALBERT, ModernBERT), whose defaults are BERT's."""
    return dataclasses.field(default=default, metadata={"role": role, "family": family})


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Everything that defines the network. Hashable, so it can be a static jit argument."""

    vocab_size: int = _field(30522, "architecture")
    hidden_size: int = _field(768, "architecture")
    num_layers: int = _field(12, "architecture")
    num_heads: int = _field(12, "architecture")
    intermediate_size: int = _field(3072, "architecture")
    max_position_embeddings: int = _field(512, "architecture")
    type_vocab_size: int = _field(2, "architecture")
    hidden_dropout_rate: float = _field(0.1, "training")
    attention_dropout_rate: float = _field(0.1, "training")
    layer_norm_eps: float = _field(1e-12, "architecture")
    initializer_range: float = _field(0.02, "training")
    # compute dtype of matmuls and activations ("bfloat16" on accelerators)
    dtype: str = _field("float32", "compute")
    # storage dtype of the parameters (and so of the optimizer state)
    param_dtype: str = _field("float32", "layout")
    # "xla" | "cudnn" (flash attention, NVIDIA GPUs) | "splash" (Pallas kernel, TPUs)
    attention_impl: str = _field("xla", "compute")
    # "gather" or "one_hot" (a [B, S, V] x [V, H] matmul: what TPUs prefer)
    word_embedding: str = _field("gather", "compute")
    remat_policy: str = _field("none", "compute")  # a key of REMAT_POLICIES
    # nn.scan over the blocks: one compiled block, params stacked on "layers"
    scan_layers: bool = _field(False, "layout")
    # LayerNorm before each sub-layer plus a final one (not original BERT)
    pre_layer_norm: bool = _field(False, "architecture", family=True)
    # Family options (RoBERTa, ALBERT, ModernBERT); the defaults are BERT. docs/design.md lists them.
    # "learned" (a table) | "rotary" (RoPE on q, k) | "none"
    position_embedding: str = _field("learned", "architecture", family=True)
    # first row of the position table (RoBERTa: padding_idx + 1 = 2)
    position_offset: int = _field(0, "architecture", family=True)
    # "gelu" (erf) | "gelu_tanh" (ALBERT's gelu_new) | "geglu" (input dense -> 2F)
    activation: str = _field("gelu", "architecture", family=True)
    # "post" | "pre": embedding norm, none before layer 0's attention, final norm
    norm_placement: str = _field("post", "architecture", family=True)
    use_bias: bool = _field(True, "architecture", family=True)  # biases of linear layers and norms (ModernBERT: none)
    norm: str = _field("layernorm", "architecture", family=True)  # "layernorm" | "rmsnorm"
    rotary_theta: float = _field(10000.0, "architecture")  # RoPE base of the local (or all) layers
    # RoPE base of the global layers (ModernBERT: 160,000); 0: rotary_theta
    global_rotary_theta: float = _field(0.0, "architecture")
    # sliding window in total (128: +-64) on the local layers; 0: none
    local_attention_window: int = _field(0, "architecture", family=True)
    # layer i attends globally when i % n == 0 (ModernBERT: 3)
    global_attention_every: int = _field(1, "architecture")
    # ALBERT's factorised embedding width E, projected to H once; 0: hidden_size
    embedding_size: int = _field(0, "architecture", family=True)
    # ALBERT's groups of layers sharing parameters; 0: one per layer (BERT)
    num_hidden_groups: int = _field(0, "architecture", family=True)
    # a key of POOLERS: "tanh" (dense, tanh on [CLS]) | "gelu_norm" (ModernBERT's head)
    pooler: str = _field("tanh", "architecture", family=True)
    # Pruned attention heads (bertjax.compression.pruning): the head count of each parameter group (each
    # layer; ALBERT's shared groups, one count for all the layers of a group), () = num_heads everywhere;
    # and the head size D, 0 = hidden_size / num_heads. A pruned group's q/k/v kernels are [H, h_g, D].
    layer_heads: tuple = _field((), "architecture")
    head_size: int = _field(0, "architecture")

    def __post_init__(self):
        # A checkpoint's JSON metadata gives a list: the config must stay hashable (a static jit argument).
        object.__setattr__(self, "layer_heads", tuple(int(h) for h in self.layer_heads))
        autos = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) == "auto"]
        if autos:
            raise ValueError(f"model fields {autos} are 'auto': resolve them with BertConfig.from_dict "
                             "(or model.resolve_platform) for the platform the model runs on")
        if self.head_size < 0:
            raise ValueError(f"model.head_size={self.head_size} must be >= 0 (0: hidden_size / num_heads)")
        if not self.head_size and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"model.attention_impl={self.attention_impl!r}: choose one of {ATTENTION_IMPLS}")
        if self.attention_impl in ("cudnn", "splash") and self.attention_dropout_rate > 0:
            raise ValueError(
                f"model.attention_impl={self.attention_impl!r} has no attention-probability dropout (a fused "
                "kernel): set model.attention_dropout_rate=0.0 or model.attention_impl='xla'"
            )
        if self.word_embedding not in WORD_EMBEDDINGS:
            raise ValueError(f"model.word_embedding={self.word_embedding!r}: choose one of {WORD_EMBEDDINGS}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"model.remat_policy={self.remat_policy!r}: choose one of {sorted(REMAT_POLICIES)}")
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))  # raises on an unknown dtype name
        self._check_family_options()
        self._check_layer_heads()

    def _check_layer_heads(self):
        """Pruned heads: a count per parameter group in [1, num_heads]; a scanned stack needs one shape, so
        one count."""
        counts = self.layer_heads
        if not counts:
            return
        if len(counts) != self.num_groups:
            raise ValueError(f"model.layer_heads={counts} needs one head count for each of the model's "
                             f"{self.num_groups} parameter groups (its layers; ALBERT's model.num_hidden_groups)")
        if not all(1 <= h <= self.num_heads for h in counts):
            raise ValueError(f"model.layer_heads={counts}: each layer keeps 1 to model.num_heads={self.num_heads} "
                             "heads")
        if self.scan_layers and len(set(counts[scanned_layout(self)[0]:])) > 1:
            raise ValueError(f"model.scan_layers=True stacks layers of one shape, and model.layer_heads={counts} "
                             "differ: set model.scan_layers=False")

    def _check_family_options(self):
        """One line naming the keys, for a choice that is unknown or that another choice rules out."""
        choices = dict(position_embedding=POSITION_EMBEDDINGS, activation=ACTIVATIONS,
                       norm_placement=NORM_PLACEMENTS, norm=NORMS, pooler=tuple(POOLERS))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name}={getattr(self, name)!r}: choose one of {allowed}")
        problems = []
        if self.position_embedding == "rotary" and self.head_dim % 2:
            problems.append(f"model.position_embedding='rotary' needs an even head size, and model.hidden_size/"
                            f"model.num_heads={self.head_dim}")
        if self.position_offset and self.position_embedding != "learned":
            problems.append("model.position_offset is set but model.position_embedding is not 'learned'")
        if self.position_offset < 0 or self.type_vocab_size < 0 or self.embedding_size < 0:
            problems.append("model.position_offset, model.type_vocab_size and model.embedding_size must be >= 0")
        if self.pre_layer_norm and self.norm_placement != "post":
            problems.append("model.pre_layer_norm=True and model.norm_placement='pre' are two pre-norm layouts: "
                            "set one")
        if self.local_attention_window < 0 or self.local_attention_window % 2:
            problems.append(f"model.local_attention_window={self.local_attention_window} must be an even width >= 0")
        if self.global_attention_every < 1:
            problems.append(f"model.global_attention_every={self.global_attention_every} must be >= 1")
        groups = self.num_hidden_groups
        if groups < 0 or (groups and self.num_layers % groups):
            problems.append(f"model.num_hidden_groups={groups} must divide model.num_layers={self.num_layers}")
        if self.num_groups != self.num_layers and (self.local_attention_window or self.norm_placement == "pre"):
            problems.append("model.num_hidden_groups (shared layers) cannot be combined with "
                            "model.local_attention_window or model.norm_placement='pre' (layers that differ)")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> "BertConfig":
        if size not in SIZES:
            raise ValueError(f"model size {size!r} is unknown: choose one of {list(SIZES)}")
        layers, hidden = SIZES[size]
        fields = dict(num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**resolve_platform(fields))

    @classmethod
    def from_dict(cls, fields: dict, platform: str | None = None) -> "BertConfig":
        """From the config's model section, "auto" fields resolved for `platform` (default: the backend
        JAX runs on); an unknown key is an error, not silently ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}: valid keys are {sorted(known)}")
        return cls(**resolve_platform(dict(fields), platform))

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    def heads_of(self, layer: int) -> int:
        """The attention heads of layer `layer` (fewer than num_heads where pruning removed some)."""
        return self.heads_of_group(layer // (self.num_layers // self.num_groups))

    def heads_of_group(self, group: int) -> int:
        """The attention heads of parameter group `group` (a layer, or one of ALBERT's shared groups)."""
        return self.layer_heads[group] if self.layer_heads else self.num_heads

    @property
    def embedding_width(self) -> int:
        """E: the width of the embedding tables (and of the MLM head's decoder input)."""
        return self.embedding_size or self.hidden_size

    @property
    def num_groups(self) -> int:
        """Distinct parameter sets in the stack: num_layers unless ALBERT shares them."""
        return self.num_hidden_groups or self.num_layers

    def is_local(self, layer: int) -> bool:
        return bool(self.local_attention_window) and layer % self.global_attention_every != 0


def field_names(*roles: str, family: bool | None = None) -> tuple[str, ...]:
    """The BertConfig fields of these roles (all with none), in declaration order; family=True: only the
    family options."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown field roles {unknown}: the roles are {ROLES}")
    return tuple(f.name for f in dataclasses.fields(BertConfig)
                 if (not roles or f.metadata["role"] in roles) and (family is None or f.metadata["family"] == family))


def fields_of(cfg: BertConfig, *roles: str) -> dict:
    """{name: value} of cfg's fields of these roles."""
    return {name: getattr(cfg, name) for name in field_names(*roles)}


ARCHITECTURE_FIELDS = field_names("architecture")
# What a resumed run must agree on with its checkpoint: the network and how its parameters are stored.
RESUME_FIELDS = field_names("architecture", "layout")
# The options that choose a family's network (RoBERTa, ALBERT, ModernBERT); BERT has their defaults.
FAMILY_OPTIONS = field_names(family=True)


def scanned_layout(cfg: BertConfig) -> tuple[int, int]:
    """(U, K) of the scanned encoder: its first U layers stay unrolled (layers_0 ...), and the params
    of the K parameter sets after them are stacked on the leading "layers" axis.

    BERT: (0, L). ALBERT: (0, G), the groups stacked, each applied L/G times in its scan step.
    norm_placement="pre" (ModernBERT): (1, L-1), as layer 0 alone has no attention norm.
    """
    unrolled = 1 if cfg.norm_placement == "pre" else 0
    return unrolled, cfg.num_groups - unrolled


def alternates(cfg: BertConfig) -> bool:
    """Whether the layers alternate between local (sliding-window) and global attention."""
    return bool(cfg.local_attention_window) and cfg.global_attention_every > 1


class Encoder(nn.Module):
    """L blocks, either unrolled (params layers_0 ... layers_{L-1}) or scanned (params stacked on axis 0:
    scanned_layout gives the layout).

    With `rows` ([B, Q] positions) only those rows of the output are returned. Unrolled, the last block
    computes only them; scanned, every block is the same compiled body, so the rows are taken after it.
    head_mask: None or [L, N] float, layer l's heads multiplied by head_mask[l, :heads_of(l)].
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x, padding, deterministic: bool, output_hidden_states: bool = False, rows=None,
                 head_mask=None):
        cfg = self.config
        layer_mask = lambda i: None if head_mask is None else head_mask[i, :cfg.heads_of(i)]  # noqa: E731
        # The scanned layers' rows of head_mask go in as a scanned argument (axis 0), or None broadcast.
        mask_axis = nn.broadcast if head_mask is None else 0
        block = scanned_block = layers.TransformerBlock
        if cfg.remat_policy != "none":
            policy = REMAT_POLICIES[cfg.remat_policy]
            block = nn.remat(block, policy=policy, prevent_cse=True)
            # Under scan, CSE across iterations cannot happen, so prevent_cse (which costs speed) is off.
            scanned_block = nn.remat(scanned_block, policy=policy, prevent_cse=False)

        def stack(body, length: int, in_axes=nn.broadcast):
            # All the stacked layers have one head count (BertConfig checks it): the last layer's.
            heads = cfg.heads_of(cfg.num_layers - 1)
            return nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                           in_axes=in_axes, length=length, metadata_params={nn.PARTITION_NAME: "layers"},
                           )(cfg, deterministic, output_hidden_states, heads=heads, name="layers")

        if cfg.scan_layers:
            unrolled, stacked = scanned_layout(cfg)
            per_group = cfg.num_layers // cfg.num_groups
            layer_outputs = []  # L x [B, S, H]
            for i in range(unrolled):  # layer 0 of norm_placement="pre": it has no attention norm
                last_rows = rows if i == cfg.num_layers - 1 else None
                x, out = block(cfg, deterministic, output_hidden_states, cfg.is_local(i), i == 0,
                               heads=cfg.heads_of(i), name=f"layers_{i}")(x, padding, last_rows,
                                                                          head_mask=layer_mask(i))
                layer_outputs.append(out)
            stacked_mask = None if head_mask is None else head_mask[unrolled:, :cfg.heads_of(cfg.num_layers - 1)]
            if per_group > 1:
                if head_mask is not None:
                    raise ValueError("head_mask is not supported with scanned ALBERT groups: set "
                                     "model.scan_layers=False")
                # ALBERT: a scan step per group, whose params an inner scan (params broadcast) applies L/G times.
                repeat = nn.scan(scanned_block, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                                 in_axes=nn.broadcast, length=per_group)
                x, per_layer = stack(repeat, stacked)(x, padding)
                if output_hidden_states:  # [G, L/G, B, S, H] -> [L, B, S, H]
                    per_layer = per_layer.reshape((cfg.num_layers, *per_layer.shape[2:]))
            elif stacked and alternates(cfg):
                # Each step reads its layer's kind (scanned over) and selects by it: the band of its mask
                # (XLA), one of two kernel calls (cuDNN), one of the two rotary tables computed here once.
                is_local = jnp.asarray([cfg.is_local(i) for i in range(unrolled, cfg.num_layers)])  # [K] bool
                tables = None
                if cfg.position_embedding == "rotary":
                    positions = jnp.arange(x.shape[1])[None] if padding.positions is None else padding.positions
                    tables = layers.local_and_global_rotary_tables(cfg, positions)
                # padding, rows (None), is_local, tables, head_mask
                in_axes = (nn.broadcast, nn.broadcast, 0, nn.broadcast, mask_axis)
                x, per_layer = stack(scanned_block, stacked, in_axes)(x, padding, None, is_local, tables,
                                                                      stacked_mask)
            elif stacked:
                in_axes = (nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, mask_axis)
                x, per_layer = stack(scanned_block, stacked, in_axes)(x, padding, None, None, None, stacked_mask)
            if stacked and output_hidden_states:
                layer_outputs += list(per_layer)
            if stacked and rows is not None:
                x = jnp.take_along_axis(x, rows[..., None], axis=1)  # [B, Q, H]
        else:
            # ALBERT: layer i runs group i // (L / G)'s parameters; otherwise one group per layer.
            per_group = cfg.num_layers // cfg.num_groups
            blocks = [block(cfg, deterministic, output_hidden_states, cfg.is_local(g * per_group), g == 0,
                            heads=cfg.heads_of_group(g), name=f"layers_{g}") for g in range(cfg.num_groups)]
            layer_outputs = []
            for i in range(cfg.num_layers):
                last_rows = rows if i == cfg.num_layers - 1 else None
                x, out = blocks[i // per_group](x, padding, last_rows, head_mask=layer_mask(i))
                layer_outputs.append(out)
        if cfg.pre_layer_norm or cfg.norm_placement == "pre":
            x = layers.layer_norm(cfg, "final_layer_norm")(x)
        return x, layer_outputs


class BertModel(nn.Module):
    """Embeddings + encoder + pooler on [CLS]: what BertModel is in every BERT implementation. The pooler
    is BERT's dense + tanh, or with model.pooler="gelu_norm" ModernBERT's dense + GELU + norm (params
    pooler and pooler_norm), which the per-token heads also apply at every token (`pool`)."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = layers.Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = layers.dense(cfg, cfg.hidden_size, ("embed", None), "pooler")
        if cfg.pooler == "gelu_norm":
            self.pooler_norm = layers.layer_norm(cfg, "pooler_norm")

    def __call__(self, input_ids, segment_ids, input_mask, deterministic: bool = True,
                 output_hidden_states: bool = False, output_rows=None, sequence_ids=None, position_ids=None,
                 cls_positions=None, head_mask=None):
        # input_ids, segment_ids, input_mask: [B, S] int; input_mask is 1 at real tokens, 0 at padding.
        # output_rows: None, or [B, Q] int positions: sequence_output is then [B, Q, H], those rows
        # only, and the last block (unrolled) computes just them and [CLS] (for the pooler).
        # Packed rows (several sequences per row, docs/data.md): sequence_ids [B, S] int (k for the k-th
        # sequence, 0 at padding), position_ids [B, S] int (positions within each sequence) and
        # cls_positions [B, K] int (each sequence's [CLS]); pooled_output is then [B, K, H].
        # head_mask: None or [L, N] float, each head's attention output multiplied by its entry (1 keeps,
        # 0 removes), what transformers' head_mask means; a pruned layer l reads its first layer_heads[l].
        if head_mask is not None:
            expected = (self.config.num_layers, max(self.config.layer_heads or (self.config.num_heads,)))
            if head_mask.shape != expected:
                raise ValueError(f"head_mask has shape {head_mask.shape}: [layers, heads] = {expected} is expected")
        if output_rows is not None and output_hidden_states:
            raise ValueError("output_rows and output_hidden_states exclude each other: the last layer's "
                             "hidden state would hold only some rows")
        packed = sequence_ids is not None
        if packed != (cls_positions is not None):
            raise ValueError("packed rows need both sequence_ids and cls_positions")
        x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)  # [B, S, H]
        if packed:
            # Block-diagonal: a token sees the real tokens of its own sequence only.
            same = sequence_ids[:, :, None] == sequence_ids[:, None, :]  # [B, S, S]
            mask = (same & (sequence_ids > 0)[:, None, :])[:, None]  # [B, 1, S, S]
            padding = layers.Padding(mask, None, position_ids, sequence_ids)
        else:
            mask = (input_mask > 0)[:, None, None, :]  # [B, 1, 1, S]
            lengths = jnp.sum(input_mask > 0, axis=-1, dtype=jnp.int32)  # [B]: rows are right-padded
            padding = layers.Padding(mask, lengths, position_ids, (input_mask > 0).astype(jnp.int32))
        cls_rows = cls_positions if packed else jnp.zeros_like(input_ids[:, :1])  # [B, K] (K = 1 unpacked)
        rows = None
        if output_rows is not None:
            rows = jnp.concatenate([cls_rows, output_rows], axis=1)  # [B, K+Q]: the [CLS] rows first
        encoded, layer_outputs = self.encoder(x, padding, deterministic, output_hidden_states, rows, head_mask)
        num_cls = cls_rows.shape[1]
        cls_hidden = encoded[:, :num_cls] if rows is not None else jnp.take_along_axis(encoded, cls_rows[..., None], 1)
        pooled_output = self.pool(cls_hidden)  # [B, K, H]
        if not packed:
            pooled_output = pooled_output[:, 0]  # [B, H]
        sequence_output = encoded if rows is None else encoded[:, num_cls:]  # [B, S, H] or [B, Q, H]
        outputs = {"sequence_output": sequence_output, "pooled_output": pooled_output}
        if output_hidden_states:
            outputs["hidden_states"] = [x] + layer_outputs  # L+1 x [B, S, H], embeddings first
        return outputs

    def pool(self, x):
        """The pooler's transform of hidden states [..., H] -> [..., H]: of [CLS] in __call__, of every
        token in the span and tagging heads where POOLERS[model.pooler] says so."""
        if self.config.pooler == "tanh":
            return jnp.tanh(self.pooler(x))
        return self.pooler_norm(nn.gelu(self.pooler(x), approximate=False))  # ModernBERT's classifier_activation

    def word_embedding_table(self):
        return self.embeddings.word_embedding_table()


class MaskedLMHead(nn.Module):
    """Dense H->E (E = H but for ALBERT), GELU, LayerNorm, then the tied word-embedding decoder plus a
    per-token bias (kept without use_bias too: ModernBERT's decoder has one)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, word_embeddings):
        # x: [B, P, H] hidden states at the masked positions; word_embeddings: [V, E]
        cfg = self.config
        x = layers.dense(cfg, cfg.embedding_width, ("embed", None), "transform")(x)  # [B, P, E]
        x = layers.activation(cfg.activation)(x)
        x = layers.layer_norm(cfg, "layer_norm")(x)
        # Accumulate in float32: the softmax over V = 30k entries is where bf16 loses most.
        logits = jnp.einsum(
            "bph,vh->bpv", x, word_embeddings.astype(cfg.dtype), preferred_element_type=jnp.float32
        )  # [B, P, V]
        bias = self.param("output_bias", layers.zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        logits = logits + bias.astype(jnp.float32)
        return nn.with_logical_constraint(logits, ("batch", None, "vocab"))


class BertForPreTraining(nn.Module):
    """BertModel with the masked-LM head (at gathered positions) and the next-sentence head."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.bert = BertModel(cfg)
        self.mlm_head = MaskedLMHead(cfg)
        self.nsp_head = layers.dense(cfg, 2, ("embed", None), "nsp_head")

    def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions, deterministic: bool = True,
                 heads_only: bool = False, sequence_ids=None, position_ids=None, sentence_positions=None):
        # masked_lm_positions: [B, P] int, padded with 0 where there are fewer predictions (weight 0).
        # Only the P gathered positions go through the head: V-wide logits at every one of S positions
        # would cost (S/P) times more in the largest matmul of the model.
        # heads_only (what training and evaluation use): the last block, too, runs only at the rows the
        # heads read ([CLS] and the P positions); the same numbers, and sequence_output holds those P
        # rows ([B, P, H]) instead of all S. For mini that is a sixth of the encoder's work.
        # Packed rows: sequence_ids, position_ids as BertModel takes them, sentence_positions [B, K] the
        # [CLS] of each sequence; nsp_logits are then [B, K, 2], one pair per sequence.
        packing = dict(sequence_ids=sequence_ids, position_ids=position_ids, cls_positions=sentence_positions)
        if heads_only:
            outputs = self.bert(input_ids, segment_ids, input_mask, deterministic, output_rows=masked_lm_positions,
                                **packing)
            gathered = outputs["sequence_output"]  # [B, P, H]
        else:
            outputs = self.bert(input_ids, segment_ids, input_mask, deterministic, **packing)
            gathered = jnp.take_along_axis(outputs["sequence_output"], masked_lm_positions[..., None], axis=1)
        outputs["mlm_logits"] = self.mlm_head(gathered, self.bert.word_embedding_table())  # [B, P, V] f32
        outputs["nsp_logits"] = self.nsp_head(outputs["pooled_output"]).astype(jnp.float32)  # [B, 2] or [B, K, 2]
        return outputs


def pretraining_loss(mlm_logits, nsp_logits, masked_lm_ids, masked_lm_weights, next_sentence_labels,
                     objective: str = "nsp", sentence_weights=None):
    """BERT's loss: weighted masked-LM NLL over the real predictions plus mean NSP cross-entropy.

    mlm_logits: [B, P, V]; nsp_logits: [B, 2]; masked_lm_ids: [B, P] int; masked_lm_weights: [B, P] float
    (1 for a real prediction, 0 for padding); next_sentence_labels: [B] int (0 IsNext, 1 NotNext).
    objective: "nsp"; "sop" (ALBERT: the same 2-way head on 0 in order / 1 swapped, metrics sop_*);
    "none" (RoBERTa, ModernBERT: masked LM only, no sentence metrics; nsp_logits may be None).
    Packed rows: nsp_logits [B, K, 2], next_sentence_labels [B, K], sentence_weights [B, K] (1 for a
    sequence, 0 for an empty slot). Either way the masked-LM loss is the mean over the batch's
    predictions and the sentence loss the mean over its sequences: a packed batch's loss is the same
    number as the loss of its sequences unpacked.
    Returns (loss, metrics) with metrics holding sums and counts so that they add across microbatches.
    """
    if objective not in ("nsp", "sop", "none"):
        raise ValueError(f"data.objective={objective!r}: choose nsp, sop or none")
    weights = masked_lm_weights.astype(jnp.float32)
    logits = mlm_logits.astype(jnp.float32)
    # NLL = logsumexp(logits) - logit[label], the label's logit picked by a one-hot select rather than
    # a gather: the gradient (softmax - one-hot) is then one fused element-wise pass over [B, P, V]
    # instead of a zero-filled [B, P, V] buffer plus a scatter.
    is_label = jnp.arange(logits.shape[-1]) == masked_lm_ids[..., None]  # [B, P, V] bool
    label_logit = jnp.sum(jnp.where(is_label, logits, 0.0), axis=-1)  # [B, P]
    mlm_nll = jax.nn.logsumexp(logits, axis=-1) - label_logit  # [B, P]
    # The 1e-5 keeps a batch without predictions finite, as in the original.
    mlm_loss = jnp.sum(weights * mlm_nll) / (jnp.sum(weights) + 1e-5)
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_correct": jnp.sum(weights * (jnp.argmax(mlm_logits, -1) == masked_lm_ids)),
        "mlm_count": jnp.sum(weights),
    }
    if objective == "none":  # the label of a FULL-SENTENCES row means nothing
        return mlm_loss, metrics
    if sentence_weights is None:
        sentence_weights = jnp.ones(next_sentence_labels.shape, jnp.float32)  # [B]: one per row
    sentence_weights = sentence_weights.astype(jnp.float32)
    nsp_logp = jax.nn.log_softmax(nsp_logits.astype(jnp.float32), axis=-1)
    nsp_nll = -jnp.take_along_axis(nsp_logp, next_sentence_labels[..., None], axis=-1)[..., 0]  # [B] or [B, K]
    num_sentences = jnp.sum(sentence_weights)
    nsp_loss = jnp.sum(sentence_weights * nsp_nll) / jnp.maximum(num_sentences, 1.0)
    metrics[f"{objective}_loss"] = nsp_loss
    metrics[f"{objective}_correct"] = jnp.sum(sentence_weights * (jnp.argmax(nsp_logits, -1) == next_sentence_labels))
    metrics[f"{objective}_count"] = num_sentences
    return mlm_loss + nsp_loss, metrics


def check_input_shapes(cfg: BertConfig, max_seq_length: int, max_predictions_per_seq: int) -> None:
    """Fail early, with what to change, on sequences the model cannot take."""
    if not 8 <= max_seq_length <= cfg.max_position_embeddings:
        raise ValueError(f"data.max_seq_length={max_seq_length} must lie in [8, model.max_position_embeddings="
                         f"{cfg.max_position_embeddings}]")
    # [CLS] and two [SEP] are never predicted.
    if not 1 <= max_predictions_per_seq <= max_seq_length - 3:
        raise ValueError(f"data.max_predictions_per_seq={max_predictions_per_seq} must lie in [1, "
                         f"data.max_seq_length - 3 = {max_seq_length - 3}] (20 at seq 128, 80 at seq 512)")


def dummy_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict:
    """Zero inputs of the right shapes and dtypes, for init and jax.eval_shape."""
    ids = jnp.zeros((batch_size, seq_len), jnp.int32)
    preds = jnp.zeros((batch_size, max_predictions), jnp.int32)
    return {
        "input_ids": ids,
        "segment_ids": ids,
        "input_mask": jnp.ones_like(ids),
        "masked_lm_positions": preds,
    }


def count_params(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def stack_layers(encoder_params: dict, cfg: BertConfig) -> dict:
    """Unrolled encoder params {layers_0: p0, ...} -> the scanned layout of cfg (scanned_layout):
    {layers_0 .. layers_{U-1} as they are, layers: stack(p_U .. p_{U+K-1})}. ALBERT's unrolled params
    are its G groups, so its stack is [G, ...]."""
    unrolled, stacked = scanned_layout(cfg)
    kept = {f"layers_{i}" for i in range(unrolled)}
    rest = {k: v for k, v in encoder_params.items() if not k.startswith("layers_") or k in kept}
    if stacked:
        layers = [encoder_params[f"layers_{i}"] for i in range(unrolled, unrolled + stacked)]
        rest["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    return rest


def unstack_layers(encoder_params: dict, cfg: BertConfig) -> dict:
    """The scanned layout of cfg (stack_layers) -> unrolled {layers_0: p0, ...}."""
    unrolled, stacked = scanned_layout(cfg)
    rest = {k: v for k, v in encoder_params.items() if k != "layers"}
    for i in range(stacked):
        rest[f"layers_{unrolled + i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], encoder_params["layers"])
    return rest
