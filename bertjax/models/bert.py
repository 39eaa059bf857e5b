"""The BERT encoder with its pretraining heads (masked LM and next sentence), in Flax linen.

Faithful to Devlin et al. 2018 and the original TensorFlow release: summed token + segment + learned
position embeddings with LayerNorm (eps 1e-12), post-LN Transformer blocks with exact (erf) GELU, a tanh
pooler on [CLS], and a masked-LM head whose decoder is the transposed word-embedding matrix plus a bias,
evaluated only at the gathered masked positions. The block is here; what it is built of is in
models/layers.py and models/attention.py.

Every parameter carries logical axis names and the key activations carry logical constraints; the
config's one rules table (configs/common.py) maps them onto the mesh axes (data, fsdp, tensor).

Shape legend:
  B batch           S sequence length      H hidden size          N attention heads (of a layer)
  D head size H/N   F feed-forward size    P masked-LM predictions per sequence (max_predictions_per_seq)
  V vocabulary      L layers               T segment (token type) vocabulary
  (a pruned model's N differs per layer or ALBERT group, model.layer_heads, and model.head_size gives D)
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from bertjax.models import attention, fp8, fused_norm, layers, mobilebert
from bertjax.models.config import BertConfig, REMAT_POLICIES, alternates, scanned_layout
from bertjax.models.mlm_loss import DecoderInputs, logits_nll

# Collections a caller makes mutable (apply(..., mutable=[...])) to have BertModel, wherever a head wraps it,
# record each layer's output (L+1 x [B, S, H], embeddings first) or its attention scores before softmax
# (L x [B, N, S, S]) for the intermediate-layer distillation losses; unasked, neither is computed.
HIDDEN_STATES = "hidden_states"
ATTENTION_SCORES = "attention_scores"

class TransformerBlock(nn.Module):
    """One encoder block. Post-LN as in BERT: x = LN(x + Dropout(SubLayer(x))); pre-LN (pre_layer_norm,
    or norm_placement="pre"): x = x + Dropout(SubLayer(LN(x))).

    With `rows` ([B, Q] positions) the block computes its output only at those positions: attention
    still reads keys and values at every position, and everything after it (residual, LayerNorms,
    feed-forward) is per position. Exactly the rows of the full block's output, for 2 of its 12 H^2
    per token at the other positions (only the key and value projections).

    Under nn.scan a stack of alternating local and global layers passes each block its kind as the
    traced `is_local` ([] bool, scanned over) and the rotary tables of both kinds (broadcast).

    Returns (x, (x or None, scores or None)) so that nn.scan can stack the per-layer outputs (hidden state
    [B, S, H], attention scores before softmax [B, N, S, S]) when they are wanted.
    """

    config: BertConfig
    deterministic: bool
    output_hidden_states: bool = False
    local: bool = False  # sliding-window attention (model.local_attention_window) in this block
    first: bool = False  # layer 0: with norm_placement="pre", no norm before its attention (ModernBERT)
    heads: int = 0  # attention heads of this layer (pruned models); 0: config.num_heads
    output_attention_scores: bool = False  # also return the attention scores before softmax [B, N, S, S]

    @nn.compact
    def __call__(self, x, padding, rows=None, is_local=None, rope_tables=None, head_mask=None):
        # x: [B, S, H]; padding: a Padding, as SelfAttention takes it; rows: None or [B, Q] int.
        # is_local, rope_tables, head_mask: None, or as SelfAttention takes them. Returns [B, S, H], or
        # [B, Q, H] with rows.
        cfg = self.config
        at_rows = (lambda y: y) if rows is None else (lambda y: jnp.take_along_axis(y, rows[..., None], axis=1))
        attention_module = attention.SelfAttention(cfg, self.deterministic, self.local, self.heads,
                                         output_scores=self.output_attention_scores, name="attention")
        scores = []  # the attention's scores, where asked for

        def attend(y, queries):
            out = attention_module(y, padding, queries, rows, is_local, rope_tables, head_mask)
            if self.output_attention_scores:
                out, layer_scores = out
                scores.append(layer_scores)
            return out

        feed_forward = layers.FeedForward(cfg, name="mlp")
        # The embedding norm already normalises layer 0's input in ModernBERT's pre-norm stack.
        skip_first_norm = self.first and cfg.norm_placement == "pre"
        pre_norm = cfg.pre_layer_norm or cfg.norm_placement == "pre"
        # Post-LN with norm_kernel="pallas": each residual + dropout + LayerNorm is one Pallas kernel
        # (models/fused_norm.py), under the LayerNorm's name and with its params, so checkpoints load either way.
        fused = not pre_norm and cfg.norm_kernel == "pallas" and cfg.norm == "layernorm"
        if fused:
            norm = lambda name: fused_norm.FusedResidualNorm(  # noqa: E731
                cfg.layer_norm_eps, cfg.hidden_dropout_rate, cfg.use_bias, cfg.param_dtype, name=name)
        else:
            norm = lambda name: layers.layer_norm(cfg, name)  # noqa: E731
        attention_norm = (lambda y: y) if skip_first_norm else norm("attention_layer_norm")
        mlp_norm = norm("mlp_layer_norm")
        dropout = layers.Dropout(cfg.hidden_dropout_rate)
        if pre_norm:
            normed = attention_norm(x)
            x = at_rows(x) + dropout(attend(normed, at_rows(normed)), deterministic=self.deterministic)
            x = x + dropout(feed_forward(mlp_norm(x)), deterministic=self.deterministic)
        elif fused:
            x = attention_norm(attend(x, at_rows(x)), at_rows(x), self.deterministic)  # LN(residual + drop(y))
            x = mlp_norm(feed_forward(x), x, self.deterministic)
        else:
            x = attention_norm(at_rows(x) + dropout(attend(x, at_rows(x)), deterministic=self.deterministic))
            x = mlp_norm(x + dropout(feed_forward(x), deterministic=self.deterministic))
        x = checkpoint_name(nn.with_logical_constraint(x, ("batch", "length", "hidden")), "block_out")
        return x, (x if self.output_hidden_states else None, scores[0] if scores else None)


class Encoder(nn.Module):
    """L blocks (TransformerBlock, or with model.block="mobilebert" models/mobilebert.py's MobileBertBlock),
    either unrolled (params layers_0 ... layers_{L-1}) or scanned (params stacked on axis 0: scanned_layout
    gives the layout).

    With `rows` ([B, Q] positions) only those rows of the output are returned. Unrolled, the last block
    computes only them; scanned, every block is the same compiled body, so the rows are taken after it.
    head_mask: None or [L, N] float, layer l's heads multiplied by head_mask[l, :heads_of(l)].
    Returns (x, hidden, scores): each layer's output (L x [B, S, H], with output_hidden_states) and its
    attention scores before softmax (L x [B, N, S, S], with output_attention_scores), else empty lists.
    """

    config: BertConfig
    output_attention_scores: bool = False

    @nn.compact
    def __call__(self, x, padding, deterministic: bool, output_hidden_states: bool = False, rows=None,
                 head_mask=None):
        cfg = self.config
        block, scanned_block = self._blocks()
        if cfg.scan_layers:
            x, layer_outputs = self._scanned(block, scanned_block, x, padding, deterministic, output_hidden_states,
                                             rows, head_mask)
        else:
            x, layer_outputs = self._unrolled(block, x, padding, deterministic, output_hidden_states, rows, head_mask)
        if cfg.pre_layer_norm or cfg.norm_placement == "pre":
            x = layers.layer_norm(cfg, "final_layer_norm")(x)
        hidden = [h for h, _ in layer_outputs if h is not None]
        scores = [a for _, a in layer_outputs if a is not None]
        return x, hidden, scores

    def _block(self, block, deterministic, output_hidden_states, local, first, heads, name):
        return block(self.config, deterministic, output_hidden_states, local, first, heads=heads,
                     output_attention_scores=self.output_attention_scores, name=name)

    def _blocks(self):
        """The block as the unrolled layers and as the scanned ones run it: rematerialised as
        model.remat_policy says (under scan without prevent_cse)."""
        cfg = self.config
        block = scanned_block = mobilebert.MobileBertBlock if cfg.block == "mobilebert" else TransformerBlock
        if cfg.remat_policy != "none":
            policy = REMAT_POLICIES[cfg.remat_policy]
            block = nn.remat(block, policy=policy, prevent_cse=True)
            # Under scan, CSE across iterations cannot happen, so prevent_cse (which costs speed) is off.
            scanned_block = nn.remat(scanned_block, policy=policy, prevent_cse=False)
        return block, scanned_block

    def _layer_mask(self, head_mask, i: int):
        """Layer i's row of head_mask, its own heads wide (None without a mask)."""
        return None if head_mask is None else head_mask[i, :self.config.heads_of(i)]

    def _unrolled(self, block, x, padding, deterministic, output_hidden_states, rows, head_mask):
        """Every layer a call of its group's block (params layers_0 ... layers_{G-1})."""
        cfg = self.config
        # ALBERT: layer i runs group i // (L / G)'s parameters; otherwise one group per layer.
        per_group = cfg.num_layers // cfg.num_groups
        blocks = [self._block(block, deterministic, output_hidden_states, cfg.is_local(g * per_group), g == 0,
                              cfg.heads_of_group(g), f"layers_{g}") for g in range(cfg.num_groups)]
        layer_outputs = []  # L x (hidden or None, scores or None)
        for i in range(cfg.num_layers):
            last_rows = rows if i == cfg.num_layers - 1 else None
            x, out = blocks[i // per_group](x, padding, last_rows, head_mask=self._layer_mask(head_mask, i))
            layer_outputs.append(out)
        return x, layer_outputs

    def _scanned(self, block, scanned_block, x, padding, deterministic, output_hidden_states, rows, head_mask):
        """The first U layers unrolled, then the K stacked parameter sets in one scan (scanned_layout)."""
        cfg = self.config
        unrolled, stacked = scanned_layout(cfg)
        layer_outputs = []  # L x (hidden [B, S, H] or None, scores [B, N, S, S] or None)
        for i in range(unrolled):  # layer 0 of norm_placement="pre": it has no attention norm
            last_rows = rows if i == cfg.num_layers - 1 else None
            x, out = self._block(block, deterministic, output_hidden_states, cfg.is_local(i), i == 0,
                                 cfg.heads_of(i), f"layers_{i}")(x, padding, last_rows,
                                                                 head_mask=self._layer_mask(head_mask, i))
            layer_outputs.append(out)
        if cfg.num_layers // cfg.num_groups > 1 or stacked:
            x, (hidden, scores) = self._scan(scanned_block, x, padding, deterministic, output_hidden_states,
                                             head_mask)
            count = cfg.num_layers - unrolled
            layer_outputs += [(None if hidden is None else hidden[i], None if scores is None else scores[i])
                              for i in range(count)]
        if stacked and rows is not None:
            x = jnp.take_along_axis(x, rows[..., None], axis=1)  # [B, Q, H]
        return x, layer_outputs

    def _scan(self, scanned_block, x, padding, deterministic, output_hidden_states, head_mask):
        """The stacked layers as one scan: ALBERT's groups, layers alternating local and global attention,
        or plain layers. Returns x and the per-layer outputs (hidden, scores) stacked on axis 0 (or None)."""
        cfg = self.config
        unrolled, stacked = scanned_layout(cfg)
        per_group = cfg.num_layers // cfg.num_groups
        stacked_mask = None if head_mask is None else head_mask[unrolled:, :cfg.heads_of(cfg.num_layers - 1)]
        # The scanned layers' rows of head_mask go in as a scanned argument (axis 0), or None broadcast.
        mask_axis = nn.broadcast if head_mask is None else 0
        if per_group > 1:
            if head_mask is not None:
                raise ValueError("head_mask is not supported with scanned ALBERT groups: set "
                                 "model.scan_layers=False")
            # ALBERT: a scan step per group, whose params an inner scan (params broadcast) applies L/G times.
            repeat = nn.scan(scanned_block, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                             in_axes=nn.broadcast, length=per_group)
            x, per_layer = self._stack(repeat, stacked, deterministic, output_hidden_states)(x, padding)
            # [G, L/G, ...] -> [L, ...]
            return x, jax.tree_util.tree_map(lambda a: a.reshape((cfg.num_layers, *a.shape[2:])), per_layer)
        if alternates(cfg):
            # Each step reads its layer's kind (scanned over) and selects by it: the band of its mask
            # (XLA), one of two kernel calls (cuDNN), one of the two rotary tables computed here once.
            is_local = jnp.asarray([cfg.is_local(i) for i in range(unrolled, cfg.num_layers)])  # [K] bool
            tables = None
            if cfg.position_embedding == "rotary":
                positions = jnp.arange(x.shape[1])[None] if padding.positions is None else padding.positions
                tables = attention.local_and_global_rotary_tables(cfg, positions)
            # padding, rows (None), is_local, tables, head_mask
            in_axes = (nn.broadcast, nn.broadcast, 0, nn.broadcast, mask_axis)
            return self._stack(scanned_block, stacked, deterministic, output_hidden_states, in_axes)(
                x, padding, None, is_local, tables, stacked_mask)
        in_axes = (nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, mask_axis)
        return self._stack(scanned_block, stacked, deterministic, output_hidden_states, in_axes)(
            x, padding, None, None, None, stacked_mask)

    def _stack(self, body, length: int, deterministic, output_hidden_states, in_axes=nn.broadcast):
        """`body` scanned `length` times, its params stacked on axis 0 under the name "layers"."""
        cfg = self.config
        # All the stacked layers have one head count (BertConfig checks it): the last layer's.
        heads = cfg.heads_of(cfg.num_layers - 1)
        # The fp8 scaling state (model.matmul_dtype="fp8") is per layer, stacked as the params are.
        return nn.scan(body, variable_axes={"params": 0, fp8.COLLECTION: 0},
                       split_rngs={"params": True, "dropout": True},
                       in_axes=in_axes, length=length, metadata_params={nn.PARTITION_NAME: "layers"},
                       )(cfg, deterministic, output_hidden_states, heads=heads,
                         output_attention_scores=self.output_attention_scores, name="layers")


class BertModel(nn.Module):
    """Embeddings + encoder + pooler on [CLS]: what BertModel is in every BERT implementation. The pooler
    is BERT's dense + tanh, or with model.pooler="gelu_norm" ModernBERT's dense + GELU + norm (params
    pooler and pooler_norm), which the per-token heads also apply at every token (`pool`).

    With the collection HIDDEN_STATES (ATTENTION_SCORES) mutable, the outputs carry "hidden_states"
    ("attention_scores") and the collection holds them under "layers": what distillation reads through any
    head. The scores need model.attention_impl="xla"."""

    config: BertConfig
    # ELECTRA's generator: the discriminator's Embeddings (tables and norm, E wide), shared; this model
    # then owns only the projection E -> H of its own width.
    shared_embeddings: nn.Module | None = None

    def setup(self):
        cfg = self.config
        if self.shared_embeddings is None:
            self.embeddings = layers.Embeddings(cfg)
        elif cfg.embedding_width != cfg.hidden_size:
            self.embeddings_project = layers.dense(cfg, cfg.hidden_size, (None, "embed"), "embeddings_project")
        scores = self._recording(ATTENTION_SCORES)
        if scores:
            attention.check_scores_available(cfg.attention_impl)
        self.encoder = Encoder(cfg, output_attention_scores=scores)
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
        # Recording for distillation (through whichever head): every layer at every row, the rows taken after.
        output_scores = self._recording(ATTENTION_SCORES)
        recording = output_scores or self._recording(HIDDEN_STATES)
        output_hidden_states = output_hidden_states or self._recording(HIDDEN_STATES)
        packed = sequence_ids is not None
        if packed != (cls_positions is not None):
            raise ValueError("packed rows need both sequence_ids and cls_positions")
        x = self._embed(input_ids, segment_ids, deterministic, position_ids)  # [B, S, H]
        padding = self._padding(input_mask, sequence_ids, position_ids, cls_positions)
        cls_rows = cls_positions if packed else jnp.zeros_like(input_ids[:, :1])  # [B, K] (K = 1 unpacked)
        rows = None
        if output_rows is not None:
            rows = jnp.concatenate([cls_rows, output_rows], axis=1)  # [B, K+Q]: the [CLS] rows first
        encoded, layer_outputs, scores = self.encoder(x, padding, deterministic, output_hidden_states,
                                                      None if recording else rows, head_mask)
        if recording and rows is not None:
            encoded = jnp.take_along_axis(encoded, rows[..., None], axis=1)  # [B, K+Q, H]
        num_cls = cls_rows.shape[1]
        cls_hidden = encoded[:, :num_cls] if rows is not None else jnp.take_along_axis(encoded, cls_rows[..., None], 1)
        pooled_output = self.pool(cls_hidden)  # [B, K, H]
        if not packed:
            pooled_output = pooled_output[:, 0]  # [B, H]
        sequence_output = encoded if rows is None else encoded[:, num_cls:]  # [B, S, H] or [B, Q, H]
        outputs = {"sequence_output": sequence_output, "pooled_output": pooled_output}
        if output_hidden_states:
            outputs["hidden_states"] = [x] + layer_outputs  # L+1 x [B, S, H], embeddings first
            if self._recording(HIDDEN_STATES):
                self.sow(HIDDEN_STATES, "layers", tuple(outputs["hidden_states"]))
        if output_scores:
            outputs["attention_scores"] = scores  # L x [B, N, S, S] float32
            self.sow(ATTENTION_SCORES, "layers", tuple(scores))
        return outputs

    def _recording(self, collection: str) -> bool:
        """Whether the caller asked for `collection` (made it mutable in apply). init makes every collection
        mutable and records nothing: the model is only being shaped."""
        return self.is_mutable_collection(collection) and not self.is_initializing()

    def _embed(self, input_ids, segment_ids, deterministic, position_ids):
        if self.shared_embeddings is None:
            return self.embeddings(input_ids, segment_ids, deterministic, position_ids)  # [B, S, H]
        x = self.shared_embeddings.embed(input_ids, segment_ids, deterministic, position_ids)  # [B, S, E]
        if self.config.embedding_width != self.config.hidden_size:
            x = self.embeddings_project(x)  # [B, S, H]
        return x

    @staticmethod
    def _padding(input_mask, sequence_ids, position_ids, cls_positions=None) -> attention.Padding:
        """Which keys each query sees: the real tokens of its row, or (packed rows: sequence_ids given) the
        real tokens of its own sequence, block-diagonal."""
        if sequence_ids is not None:
            same = sequence_ids[:, :, None] == sequence_ids[:, None, :]  # [B, S, S]
            mask = (same & (sequence_ids > 0)[:, None, :])[:, None]  # [B, 1, S, S]
            return attention.Padding(mask, None, position_ids, sequence_ids, cls_positions)
        mask = (input_mask > 0)[:, None, None, :]  # [B, 1, 1, S]
        lengths = jnp.sum(input_mask > 0, axis=-1, dtype=jnp.int32)  # [B]: rows are right-padded
        return attention.Padding(mask, lengths, position_ids, (input_mask > 0).astype(jnp.int32))

    def pool(self, x):
        """The pooler's transform of hidden states [..., H] -> [..., H]: of [CLS] in __call__, of every
        token in the span and tagging heads where POOLERS[model.pooler] says so."""
        if self.config.pooler == "tanh":
            return jnp.tanh(self.pooler(x))
        if self.config.pooler == "first":  # MobileBERT without classifier_activation: no params
            return x
        if self.config.pooler == "gelu":  # ELECTRA's classification head: dense, GELU (then its out_proj)
            return nn.gelu(self.pooler(x), approximate=False)
        return self.pooler_norm(nn.gelu(self.pooler(x), approximate=False))  # ModernBERT's classifier_activation

    def word_embedding_table(self):
        if self.shared_embeddings is not None:
            return self.shared_embeddings.word_embedding_table()
        return self.embeddings.word_embedding_table()


class MaskedLMHead(nn.Module):
    """Dense H->E (E = H but for ALBERT), GELU, LayerNorm, then the tied word-embedding decoder plus a
    per-token bias (kept without use_bias too: ModernBERT's decoder has one). MobileBERT's: dense H->H, a
    LayerNorm whatever model.norm says, and the word table widened to H (mobilebert.decoder_table)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, word_embeddings, project: bool = True):
        # x: [B, P, H] hidden states at the masked positions; word_embeddings: [V, E]
        # project=False (model.mlm_loss="chunked"): the decoder's inputs, a DecoderInputs, instead
        # of the [B, P, V] logits; the loss projects them chunk by chunk. The params are the same.
        cfg = self.config
        mobile = cfg.block == "mobilebert"
        x = layers.dense(cfg, cfg.hidden_size if mobile else cfg.embedding_width, ("embed", None), "transform")(x)
        x = layers.activation(cfg.activation)(x)  # [B, P, E] (MobileBERT: [B, P, H])
        x = layers.layer_norm(cfg, "layer_norm", norm="layernorm" if mobile else None)(x)
        if mobile:
            word_embeddings = mobilebert.decoder_table(self, cfg, word_embeddings)  # [V, H]
        bias = self.param("output_bias", layers.zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        if not project:
            return DecoderInputs(x, word_embeddings, bias, cfg.mlm_loss_chunk)
        # Accumulate in float32: the softmax over V = 30k entries is where bf16 loses most.
        logits = jnp.einsum(
            "bph,vh->bpv", x, word_embeddings.astype(cfg.dtype), preferred_element_type=jnp.float32
        )  # [B, P, V]
        logits = logits + bias.astype(jnp.float32)
        return nn.with_logical_constraint(logits, ("batch", None, "vocab"))


class BertForPreTraining(nn.Module):
    """BertModel with the masked-LM head (at gathered positions) and the next-sentence head. Its outputs
    hold "mlm_logits" [B, P, V] float32, or with model.mlm_loss="chunked" "mlm_decoder" (what
    pretraining_loss projects chunk by chunk, models/mlm_loss.py) in their place."""

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
        table = self.bert.word_embedding_table()  # [V, E]
        if self.config.mlm_loss == "chunked":
            outputs["mlm_decoder"] = self.mlm_head(gathered, table, project=False)
        else:
            outputs["mlm_logits"] = self.mlm_head(gathered, table)  # [B, P, V] f32
        outputs["nsp_logits"] = self.nsp_head(outputs["pooled_output"]).astype(jnp.float32)  # [B, 2] or [B, K, 2]
        return outputs


def mlm_output(outputs: dict):
    """What pretraining_loss's first argument is of BertForPreTraining's outputs: the logits, or under
    model.mlm_loss="chunked" the decoder's inputs."""
    return outputs["mlm_decoder"] if "mlm_decoder" in outputs else outputs["mlm_logits"]


def pretraining_loss(mlm, nsp_logits, masked_lm_ids, masked_lm_weights, next_sentence_labels,
                     objective: str = "nsp", sentence_weights=None):
    """BERT's loss: weighted masked-LM NLL over the real predictions plus mean NSP cross-entropy.

    input                 shape / dtype        meaning
    mlm                   [B, P, V] float      the masked-LM logits, or a DecoderInputs (model.mlm_loss="chunked":
                                               the same NLL and argmax by chunks of the vocabulary)
    nsp_logits            [B, 2] float         the sentence head's logits (None with objective="none")
    masked_lm_ids         [B, P] int           the original tokens at the masked positions
    masked_lm_weights     [B, P] float         1 for a real prediction, 0 for padding
    next_sentence_labels  [B] int              0 IsNext, 1 NotNext (sop: 0 in order, 1 swapped)
    sentence_weights      [B] float or None    1 for a sequence, 0 for an empty slot (None: all 1)
    objective: "nsp"; "sop" (ALBERT: the same 2-way head, metrics sop_*); "none" (RoBERTa, ModernBERT:
    masked LM only, no sentence metrics). Packed rows: nsp_logits [B, K, 2], next_sentence_labels and
    sentence_weights [B, K] (K sequence slots). Either way the masked-LM loss is the mean over the batch's
    predictions and the sentence loss the mean over its sequences: a packed batch's loss is the same
    number as the loss of its sequences unpacked.
    Returns (loss: a float32 scalar, metrics): mlm_loss, and <objective>_loss unless "none", as means;
    mlm_correct, mlm_count, <objective>_correct, <objective>_count as sums that add across microbatches.
    Example: loss, metrics = pretraining_loss(mlm_logits, nsp_logits, ids, weights, labels, objective="nsp")
    """
    if objective not in ("nsp", "sop", "none"):
        raise ValueError(f"data.objective={objective!r}: choose nsp, sop or none")
    weights = masked_lm_weights.astype(jnp.float32)
    if isinstance(mlm, DecoderInputs):
        mlm_nll, correct = mlm.nll(masked_lm_ids)  # [B, P] each
    else:
        mlm_nll, correct = logits_nll(mlm, masked_lm_ids)
    # The 1e-5 keeps a batch without predictions finite, as in the original.
    mlm_loss = jnp.sum(weights * mlm_nll) / (jnp.sum(weights) + 1e-5)
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_correct": jnp.sum(weights * correct),
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


def unrolled_encoder(encoder_params: dict, cfg: BertConfig) -> dict:
    """An encoder's params in the unrolled layout {layers_0: ..., ...}, whichever layout they are in."""
    return unstack_layers(encoder_params, cfg) if "layers" in encoder_params else dict(encoder_params)


def unstack_layers(encoder_params: dict, cfg: BertConfig) -> dict:
    """The scanned layout of cfg (stack_layers) -> unrolled {layers_0: p0, ...}."""
    unrolled, stacked = scanned_layout(cfg)
    rest = {k: v for k, v in encoder_params.items() if k != "layers"}
    for i in range(stacked):
        rest[f"layers_{unrolled + i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], encoder_params["layers"])
    return rest
