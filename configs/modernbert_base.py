"""ModernBERT-Base (Warner et al. 2024), 149M parameters: L=22, H=768, A=12, GeGLU width 1,152.

  python -m bertjax.train --config=configs/modernbert_base.py --workdir=$WORKDIR --config.data.source=...

The paper's three phases, each a run continuing the one before (recipes after the file name):
  python -m bertjax.train --config=configs/modernbert_base.py:pretrain --workdir=$P1 --config.data.source=...
  python -m bertjax.train --config=configs/modernbert_base.py:extend --workdir=$P2 --config.train.init_from=$P1 ...
  python -m bertjax.train --config=configs/modernbert_base.py:decay --workdir=$P3 --config.train.init_from=$P2 ...

The network: pre-norm LayerNorm without biases (eps 1e-5) with an embedding norm, none before layer 0's
attention and a final norm; no biases in the linear layers; rotary positions ("rotate half") with base
10,000 on the local layers and 160,000 on the global ones; attention global on layers i % 3 == 0, else
a sliding window of 128 in total (+-64); GeGLU feed-forward; a 50,368-token vocabulary; no dropout.
Converts to and from HF ModernBertForMaskedLM (bertjax.interop.hf_modernbert). With scan_layers=True layer 0
(no attention norm) stays unrolled and layers 1..L-1 are scanned, each told whether it is local.

The recipe: masked LM only (data.objective=none) at 30% masking (held-out batches 15%), StableAdamW
with fully decoupled weight decay (ModernBERT's "decoupled_stableadamw", optimi's StableAdamW with
decouple_lr=True: weight decay 1e-5 scaled by lr / peak, not on norms or biases) lr 8e-4, betas
(0.9, 0.98), eps 1e-6, no gradient clipping, a warmup-stable-decay schedule, sequences of 1,024, and the
paper's batch-size warmup from 768 to 4,608 sequences over its first 50B tokens, in microbatches of 768
(grad_accum_steps=6; bertjax/training/batch_warmup.py): 1 to 6 microbatches a step, each size for a fifth
of 21,200 steps, which hold 50B tokens. Steps are derived from the paper's token counts, the schedule
counting steps whatever their size: the learning rate's 3B tokens of warmup fall in the 768-sequence
steps (3,815 of them); 1.7T tokens = 371,000 steps (the warmup's steps hold fewer tokens).

Recipes: one_phase (the default): the pretraining above with a 1 - sqrt decay over its last 50B tokens
at 4,608 x 1,024 = 10,600 steps and the global layers' RoPE theta at 160,000 throughout, no context
extension. The paper's phases: pretrain: as above, global theta 10,000, the rate constant after its
warmup. extend: 250B tokens at 8,192 (rows of 8,192 tokens, 30% masking), the global layers' theta
raised to 160,000 (local 10,000), lr 3e-4 constant, batch 576 (53,000 steps), from the pretrain run's
parameters and optimizer state (train.init_from_optimizer: the moments carried, the step and schedule
restarting at 0). decay: 50B tokens more at 8,192 and batch 576 (10,600 steps), the rate falling from
3e-4 to 0 by 1 - sqrt, from the extend run. grad_accum_steps=9 at 8,192: microbatches of 64 rows, which
split over 8 to 64 chips; change it with the hardware (python -m bertjax.plan).
"""

from configs import common


def modernbert_model(config, layers: int, hidden: int, heads: int, intermediate: int):
    """ModernBERT's network on config.model (shared by the base, large and tiny files)."""
    m = config.model
    m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = layers, hidden, heads, intermediate
    m.vocab_size = 50368
    m.max_position_embeddings = 8192  # rotary: no table, only the longest sequence allowed
    m.type_vocab_size = 0  # no segment embeddings
    m.position_embedding = "rotary"
    m.rotary_theta = 10000.0
    m.global_rotary_theta = 160000.0
    m.local_attention_window = 128
    m.global_attention_every = 3
    m.activation = "geglu"
    m.norm_placement = "pre"
    m.norm = "layernorm"
    m.use_bias = False
    m.pooler = "gelu_norm"  # ModernBERT's prediction head (dense, GELU, norm): its HF task classes' head
    m.layer_norm_eps = 1e-5
    m.hidden_dropout_rate = 0.0
    m.attention_dropout_rate = 0.0
    m.scan_layers = False


def modernbert_recipe(config, learning_rate: float):
    config.data.objective = "none"
    config.data.mask_rate = 0.3
    config.data.eval_mask_rate = 0.15
    config.data.vocab_size = 50368
    config.optimizer.name = "decoupled_stable_adamw"
    config.optimizer.learning_rate = learning_rate
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 1e-5
    config.optimizer.bias_correction = True
    config.optimizer.clip_norm = 0.0
    config.schedule.decay = "wsd"


def phase_recipes(config_file: str, pretrain: dict, extend: dict, decay: dict) -> dict:
    """The paper's three phases as recipes ({recipe: {config section: values}}, common.apply_recipe):
    `pretrain`, `extend` and `decay` give each phase's data, optimizer, schedule and train values, the
    RoPE thetas and what each continues are set here. Shared by the base, large and tiny files."""
    rope = lambda global_theta: dict(rotary_theta=10000.0, global_rotary_theta=global_theta)  # noqa: E731
    continues = lambda phase: dict(init_from_optimizer=True, continues=f"{config_file}:{phase}")  # noqa: E731
    return {
        "pretrain": {**pretrain, "model": {**pretrain.get("model", {}), **rope(10000.0)}},
        "extend": {**extend, "model": {**extend.get("model", {}), **rope(160000.0)},
                   "train": {**extend["train"], **continues("pretrain")}},
        "decay": {**decay, "model": {**decay.get("model", {}), **rope(160000.0)},
                  "train": {**decay["train"], **continues("extend")}},
    }


LONG_ROWS = dict(max_seq_length=8192, max_predictions_per_seq=2464)  # 30% of 8,192 = 2,458, rounded up
NO_BATCH_WARMUP = dict(batch_warmup_start=0, batch_warmup_steps=0)
RECIPES = {
    "one_phase": {},
    **phase_recipes(
        "configs/modernbert_base.py",
        pretrain=dict(optimizer=dict(learning_rate=8e-4), schedule=dict(warmup_steps=3815, decay_steps=0),
                      data=dict(max_seq_length=1024, max_predictions_per_seq=320),
                      train=dict(batch_size=4608, grad_accum_steps=6, batch_warmup_start=768,
                                 batch_warmup_steps=21_200, num_steps=371_000)),
        extend=dict(optimizer=dict(learning_rate=3e-4), schedule=dict(warmup_steps=0, decay_steps=0), data=LONG_ROWS,
                    train=dict(batch_size=576, grad_accum_steps=9, num_steps=53_000, **NO_BATCH_WARMUP)),
        decay=dict(optimizer=dict(learning_rate=3e-4), schedule=dict(warmup_steps=0, decay_steps=10_600),
                   data=LONG_ROWS, train=dict(batch_size=576, grad_accum_steps=9, num_steps=10_600, **NO_BATCH_WARMUP)),
    ),
}


def get_config(recipe: str = "one_phase"):
    config = common.base_config()
    modernbert_model(config, layers=22, hidden=768, heads=12, intermediate=1152)
    modernbert_recipe(config, learning_rate=8e-4)
    config.data.max_seq_length = 1024
    config.data.max_predictions_per_seq = 320  # 30% of 1,024 = 307, rounded up
    config.schedule.warmup_steps = 3815
    config.schedule.decay_steps = 10_600
    config.train.batch_size = 4608
    config.train.grad_accum_steps = 6  # microbatches of 768: the batch warmup's unit
    config.train.batch_warmup_start = 768
    config.train.batch_warmup_steps = 21_200
    config.train.num_steps = 371_000
    return common.apply_recipe(config, RECIPES, recipe, "configs/modernbert_base.py")
