"""The encoder's config: BertConfig (every field tagged with its role, every list of fields derived from
the tags), the size table, the remat policies by name, and what "auto" means on each platform. Nothing
here builds a network (models/bert.py does)."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

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

ATTENTION_IMPLS = ("xla", "cudnn", "splash", "blockwise")
POSITION_EMBEDDINGS = ("learned", "rotary", "none")
ACTIVATIONS = ("gelu", "gelu_tanh", "geglu", "relu")  # relu: MobileBERT's
NORM_PLACEMENTS = ("post", "pre")
# no_norm: MobileBERT's NoNorm, x * scale + bias per feature, no mean or variance (cheap on phones' chips)
NORMS = ("layernorm", "rmsnorm", "no_norm")
# model.pooler -> whether the per-token heads (span, tagging) apply it at every token too. All but "first"
# start with a dense H->H; "tanh" is BERT's pooler (RoBERTa's and ALBERT's too), "gelu_norm" ModernBERT's
# prediction head (GELU, then the encoder's norm), which its transformers task classes run before every
# classifier; "first" the first token's hidden state as it is (MobileBERT without classifier_activation).
POOLERS = {"tanh": False, "gelu_norm": True, "gelu": False, "first": False}
# model.block: "bert" (models/bert.py's TransformerBlock) | "mobilebert" (models/mobilebert.py: bottlenecks,
# stacked feed-forward networks, and MobileBERT's embedding and masked-LM decoder around them)
BLOCKS = ("bert", "mobilebert")
WORD_EMBEDDINGS = ("gather", "one_hot")
NORM_KERNELS = ("xla", "pallas")
MATMUL_DTYPES = ("default", "fp8")
MLM_LOSSES = ("logits", "chunked")

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


# attention_impl="auto" without attention dropout: the row length from which XLA's dense masked attention
# gives way to blockwise, per platform where blockwise wins there (docs/performance.md, "auto by length").
BLOCKWISE_FROM = {"cpu": 512}


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
    if auto_attention:  # auto decides the length rule too, for this platform (not the one a checkpoint came from)
        no_dropout = out.get("attention_dropout_rate", 0.1) == 0  # blockwise has none; unknown counts as some
        out["blockwise_from"] = BLOCKWISE_FROM.get(platform, 0) if out["attention_impl"] == "xla" and no_dropout else 0
    return out


def describe_attention(cfg: "BertConfig", row_length: int) -> str:
    """Which attention rows of `row_length` tokens get, and why: what a run's console line says."""
    if cfg.blockwise_from:
        chosen = "blockwise" if row_length >= cfg.blockwise_from else cfg.attention_impl
        return (f"{chosen} attention at rows of {row_length} (model.blockwise_from={cfg.blockwise_from}: "
                f"{cfg.attention_impl} below, blockwise from there)")
    return f"{cfg.attention_impl} attention (dropout {cfg.attention_dropout_rate})"


# What each field of BertConfig is, in one place; every list of fields is derived from these tags.
#   architecture  what the network is: its parameters' shapes and what it computes with them (a resume, an
#                 init_from and a Hugging Face conversion must agree on all of it)
#   layout        how the parameters are stored (a resume must agree; init_from converts)
#   compute       how the network is computed, not what it is: a checkpoint loads under any value
#   training      regularisation and initialisation: a run's own choice, whatever it starts from
ROLES = ("architecture", "layout", "compute", "training")


def _field(default, role: str, family: bool = False):
    """A BertConfig field with its role; family: one of the options that choose a family's network
    (RoBERTa, ALBERT, ModernBERT, MobileBERT), whose defaults are BERT's."""
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
    # "xla" | "cudnn" (flash attention, NVIDIA GPUs) | "splash" (Pallas kernel, TPUs) | "blockwise" (any
    # platform: memory linear in the sequence, models/blockwise.py)
    attention_impl: str = _field("xla", "compute")
    # rows of a query block and of a key block under attention_impl="blockwise"
    attention_block_size: int = _field(512, "compute")
    # "gather" or "one_hot" (a [B, S, V] x [V, H] matmul: what TPUs prefer)
    word_embedding: str = _field("gather", "compute")
    remat_policy: str = _field("none", "compute")  # a key of REMAT_POLICIES
    # nn.scan over the blocks: one compiled block, params stacked on "layers"
    scan_layers: bool = _field(False, "layout")
    # The accelerator levers (docs/performance.md, "Accelerator levers"): each computes the same network
    # another way, so a checkpoint loads under any of them.
    # q, k and v as one [H, 3, N, D] matmul; the params stay the three kernels query, key, value
    fused_qkv: bool = _field(False, "compute")
    # "xla" | "pallas": post-LN blocks' residual + dropout + LayerNorm as one Pallas kernel, forward and
    # backward, its dropout mask hashed from a counter inside the kernel (models/fused_norm.py)
    norm_kernel: str = _field("xla", "compute")
    # "default" (the compute dtype) | "fp8": the dense layers' matmuls in float8 with delayed scaling
    # (models/fp8.py); master weights and the optimizer stay in param_dtype
    matmul_dtype: str = _field("default", "compute")
    # "logits" | "chunked": the masked-LM loss from [P, V] float32 logits, or fused with the vocabulary
    # projection over chunks of mlm_loss_chunk rows of the table, never holding the whole logits
    mlm_loss: str = _field("logits", "compute")
    mlm_loss_chunk: int = _field(8192, "compute")
    # Rows of this many tokens or more attend blockwise whatever attention_impl says; 0: never. What
    # attention_impl="auto" sets on CPUs (PLATFORM_DEFAULTS), where XLA's dense masks grow as S^2.
    blockwise_from: int = _field(0, "compute")
    # LayerNorm before each sub-layer plus a final one (not original BERT)
    pre_layer_norm: bool = _field(False, "architecture", family=True)
    # Family options (RoBERTa, ALBERT, ModernBERT; MobileBERT's below), defaults BERT's. docs/design.md lists them.
    # "learned" (a table) | "rotary" (RoPE on q, k) | "none"
    position_embedding: str = _field("learned", "architecture", family=True)
    # first row of the position table (RoBERTa: padding_idx + 1 = 2)
    position_offset: int = _field(0, "architecture", family=True)
    # "gelu" (erf) | "gelu_tanh" (ALBERT's gelu_new) | "geglu" (input dense -> 2F) | "relu" (MobileBERT's)
    activation: str = _field("gelu", "architecture", family=True)
    # "post" | "pre": embedding norm, none before layer 0's attention, final norm
    norm_placement: str = _field("post", "architecture", family=True)
    use_bias: bool = _field(True, "architecture", family=True)  # biases of linear layers and norms (ModernBERT: none)
    norm: str = _field("layernorm", "architecture", family=True)  # "layernorm" | "rmsnorm" | "no_norm"
    rotary_theta: float = _field(10000.0, "architecture")  # RoPE base of the local (or all) layers
    # RoPE base of the global layers (ModernBERT: 160,000); 0: rotary_theta
    global_rotary_theta: float = _field(0.0, "architecture")
    # sliding window in total (128: +-64) on the local layers; 0: none
    local_attention_window: int = _field(0, "architecture", family=True)
    # layer i attends globally when i % n == 0 (ModernBERT: 3)
    global_attention_every: int = _field(1, "architecture")
    # Longformer's global attention for [CLS] on the local layers: the first token of each sequence sees
    # its whole sequence and every token of the sequence sees it, the window notwithstanding
    global_cls: bool = _field(False, "architecture", family=True)
    # ALBERT's factorised embedding width E, projected to H once (MobileBERT: the word table's); 0: hidden_size
    embedding_size: int = _field(0, "architecture", family=True)
    # ALBERT's groups of layers sharing parameters; 0: one per layer (BERT)
    num_hidden_groups: int = _field(0, "architecture", family=True)
    # a key of POOLERS: "tanh" (dense, tanh on [CLS]) | "gelu_norm" (ModernBERT's head) | "gelu" (dense,
    # GELU on [CLS]: ELECTRA's classification head before its out_proj) | "first" ([CLS] as it is: MobileBERT's)
    pooler: str = _field("tanh", "architecture", family=True)
    # Pruned attention heads (bertjax.compression.pruning): the head count of each parameter group (each
    # layer; ALBERT's shared groups, one count for all the layers of a group), () = num_heads everywhere;
    # and the head size D, 0 = true_hidden_size / num_heads. A pruned group's q/k/v kernels are [H, h_g, D].
    layer_heads: tuple = _field((), "architecture")
    head_size: int = _field(0, "architecture")
    # MobileBERT (Sun et al. 2020; models/mobilebert.py), with model.block="mobilebert": each layer narrows
    # its H-wide input to W = intra_bottleneck_size (0: no bottleneck, W = H), attends and runs
    # num_feedforward_networks feed-forward networks W wide, and widens back to H: thin layers, cheap on
    # phones, between wide residuals. The word table is E = embedding_size wide, its rows (trigram_input:
    # each token's beside its neighbours', 3E) projected to H before the H-wide position and segment rows
    # are added; the masked-LM decoder is the word table widened to H by H - E columns of its own. Queries
    # and keys read a second bottleneck of the input (key_query_shared_bottleneck; values the input itself),
    # or the first one as values do (use_bottleneck_attention), or the input itself (neither: W = H).
    block: str = _field("bert", "architecture", family=True)
    trigram_input: bool = _field(False, "architecture", family=True)
    intra_bottleneck_size: int = _field(0, "architecture", family=True)
    key_query_shared_bottleneck: bool = _field(False, "architecture", family=True)
    use_bottleneck_attention: bool = _field(False, "architecture", family=True)
    num_feedforward_networks: int = _field(1, "architecture", family=True)

    def __post_init__(self):
        # A checkpoint's JSON metadata gives a list: the config must stay hashable (a static jit argument).
        object.__setattr__(self, "layer_heads", tuple(int(h) for h in self.layer_heads))
        autos = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) == "auto"]
        if autos:
            raise ValueError(f"model fields {autos} are 'auto': resolve them with BertConfig.from_dict "
                             "(or models.config.resolve_platform) for the platform the model runs on")
        if self.head_size < 0:
            raise ValueError(f"model.head_size={self.head_size} must be >= 0 (0: hidden_size / num_heads)")
        if not self.head_size and self.true_hidden_size % self.num_heads:
            width = "intra_bottleneck_size" if self.intra_bottleneck_size else "hidden_size"
            raise ValueError(
                f"model.{width}={self.true_hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"model.attention_impl={self.attention_impl!r}: choose one of {ATTENTION_IMPLS}")
        if self.attention_impl in ("cudnn", "splash", "blockwise") and self.attention_dropout_rate > 0:
            raise ValueError(
                f"model.attention_impl={self.attention_impl!r} has no attention-probability dropout (it never "
                "holds the whole probability matrix): set model.attention_dropout_rate=0.0 or "
                "model.attention_impl='xla'"
            )
        if not isinstance(self.attention_block_size, int) or self.attention_block_size < 1:
            raise ValueError(f"model.attention_block_size={self.attention_block_size!r} must be a positive whole "
                             "number (512: tiles of 512 x 512 logits per head)")
        for name, allowed in (("norm_kernel", NORM_KERNELS), ("matmul_dtype", MATMUL_DTYPES), ("mlm_loss", MLM_LOSSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name}={getattr(self, name)!r}: choose one of {allowed}")
        if self.blockwise_from and self.attention_dropout_rate > 0:
            raise ValueError(f"model.blockwise_from={self.blockwise_from} attends blockwise, which has no attention-"
                             "probability dropout: set model.attention_dropout_rate=0.0 or model.blockwise_from=0")
        if self.mlm_loss_chunk < 1 or self.blockwise_from < 0:
            raise ValueError(f"model.mlm_loss_chunk={self.mlm_loss_chunk} must be >= 1 and model.blockwise_from="
                             f"{self.blockwise_from} >= 0 (0: never)")
        if self.word_embedding not in WORD_EMBEDDINGS:
            raise ValueError(f"model.word_embedding={self.word_embedding!r}: choose one of {WORD_EMBEDDINGS}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"model.remat_policy={self.remat_policy!r}: choose one of {sorted(REMAT_POLICIES)}")
        for name in ("dtype", "param_dtype"):
            try:
                jnp.dtype(getattr(self, name))
            except TypeError:
                raise ValueError(f"model.{name}={getattr(self, name)!r} is not a dtype: float32, bfloat16 or float16"
                                 + (" (or auto: the platform's)" if name == "dtype" else "")) from None
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
                       norm_placement=NORM_PLACEMENTS, norm=NORMS, pooler=tuple(POOLERS), block=BLOCKS)
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
        if self.global_cls and not self.local_attention_window:
            problems.append("model.global_cls=True opens the local layers' window to [CLS]: it needs "
                            "model.local_attention_window > 0")
        if self.global_cls and self.attention_impl == "splash":
            problems.append("model.global_cls=True needs model.attention_impl xla, cudnn or blockwise: the splash "
                            "kernel's windows are static bands")
        if self.global_attention_every < 1:
            problems.append(f"model.global_attention_every={self.global_attention_every} must be >= 1")
        groups = self.num_hidden_groups
        if groups < 0 or (groups and self.num_layers % groups):
            problems.append(f"model.num_hidden_groups={groups} must divide model.num_layers={self.num_layers}")
        if self.num_groups != self.num_layers and (self.local_attention_window or self.norm_placement == "pre"):
            problems.append("model.num_hidden_groups (shared layers) cannot be combined with "
                            "model.local_attention_window or model.norm_placement='pre' (layers that differ)")
        problems += self._mobilebert_problems()
        if problems:
            raise ValueError("; ".join(problems))

    def _mobilebert_problems(self) -> list[str]:
        """What is wrong with the MobileBERT options (model.block="mobilebert"), one phrase each."""
        own = {"trigram_input": False, "intra_bottleneck_size": 0, "key_query_shared_bottleneck": False,
               "use_bottleneck_attention": False, "num_feedforward_networks": 1}
        if self.block != "mobilebert":
            changed = [name for name, default in own.items() if getattr(self, name) != default]
            return [f"model options {changed} are MobileBERT's: set model.block='mobilebert'"] if changed else []
        problems = []
        if self.intra_bottleneck_size < 0 or self.num_feedforward_networks < 1:
            problems.append(f"model.intra_bottleneck_size={self.intra_bottleneck_size} must be >= 0 (0: none) and "
                            f"model.num_feedforward_networks={self.num_feedforward_networks} >= 1")
        if self.embedding_width > self.hidden_size:
            problems.append(f"model.embedding_size={self.embedding_size} is wider than model.hidden_size="
                            f"{self.hidden_size}: MobileBERT's masked-LM decoder widens the word table to H")
        attention_inputs = self.key_query_shared_bottleneck + self.use_bottleneck_attention
        if attention_inputs and not self.intra_bottleneck_size:
            problems.append("model.key_query_shared_bottleneck and model.use_bottleneck_attention read a "
                            "bottleneck: they need model.intra_bottleneck_size > 0")
        if attention_inputs > 1:
            problems.append("model.key_query_shared_bottleneck and model.use_bottleneck_attention are two "
                            "inputs of the attention: set one")
        if not attention_inputs and self.intra_bottleneck_size not in (0, self.hidden_size):
            problems.append(f"model.intra_bottleneck_size={self.intra_bottleneck_size} attends over the H-wide "
                            "input only where it is model.hidden_size: set model.key_query_shared_bottleneck or "
                            "model.use_bottleneck_attention")
        others = dict(norm_placement="post", pre_layer_norm=False, position_embedding="learned",
                      num_hidden_groups=0, local_attention_window=0, layer_heads=())
        differ = [name for name, value in others.items() if getattr(self, name) != value]
        if differ or self.activation == "geglu":
            problems.append(f"model.block='mobilebert' has post-norm blocks of its own, learned positions, global "
                            f"attention, no shared or pruned layers and no gated activation: unset "
                            f"{differ + ['activation'] * (self.activation == 'geglu')}")
        return problems

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
        return self.head_size or self.true_hidden_size // self.num_heads

    @property
    def true_hidden_size(self) -> int:
        """The width the attention and feed-forward networks work at: MobileBERT's bottleneck B, else H."""
        return self.intra_bottleneck_size or self.hidden_size

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
# The options that choose a family's network (RoBERTa, ALBERT, ModernBERT, MobileBERT); BERT has their defaults.
FAMILY_OPTIONS = field_names(family=True)
# The architecture fields a new phase of a run may change from its parent's (train.init_from): no
# parameter's shape depends on them, except a learned position table's length (train.extend_positions).
PHASE_FIELDS = ("max_position_embeddings", "rotary_theta", "global_rotary_theta")


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
