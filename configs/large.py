"""BERT-Large (Devlin et al. 2018), 340M parameters: L=24, H=1024, A=16.

  python -m bertjax.train --config=configs/large.py --workdir=$WORKDIR
  python -m bertjax.train --config=configs/large.py:adam_seq512 --workdir=$W512 --config.train.init_from=$WORKDIR

Recipes ("adam" (default), "adam_seq512", "lamb_phase1", "lamb_phase2"):
adam: the paper's pretraining: Adam (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01, no bias
correction), lr 1e-4 with 10,000 warmup steps then linear decay, batch 256, global-norm clipping 1.0;
900,000 steps at seq 128. adam_seq512: the last 100,000 of the paper's 1,000,000 steps at seq 512,
from the seq-128 parameters: the same linear decay, continued (lr 1e-5 down to 0).
  python -m bertjax.train --config=configs/large.py:lamb_phase1 --workdir=$P1
  python -m bertjax.train --config=configs/large.py:lamb_phase2 --workdir=$P2 --config.train.init_from=$P1

lamb_phase1/2: NVIDIA's large-batch LAMB recipe (You et al. 2019): batch 65,536 at seq 128 for 7,038
steps (lr 6e-3, 28.43% warmup), then batch 32,768 at seq 512 for 1,563 steps (lr 4e-3, 12.8% warmup),
lr * (1 - step/total)^0.5. grad_accum_steps is set for 8 accelerators holding 64 (phase 1) or 16
(phase 2) sequences each; change it with the hardware, the global batch stays the same.

With no corpus set this trains on the built-in demo corpus; for real pretraining set data.source.
"""

from configs import common

# NVIDIA's two phases; the Adam recipes are the paper's (common.DEVLIN_RECIPES), as for base.
LAMB_RECIPES = {
    "lamb_phase1": dict(
        optimizer=dict(name="lamb", learning_rate=6e-3, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                       bias_correction=True),  # as NVIDIA's FusedLAMB
        schedule=dict(warmup_steps=2000, decay="poly", power=0.5),  # 28.43% of 7,038
        train=dict(batch_size=65536, grad_accum_steps=128, num_steps=7038),
    ),
    "lamb_phase2": dict(
        optimizer=dict(name="lamb", learning_rate=4e-3, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                       bias_correction=True),
        schedule=dict(warmup_steps=200, decay="poly", power=0.5),  # 12.8% of 1,563
        train=dict(batch_size=32768, grad_accum_steps=256, num_steps=1563),
        data=dict(max_seq_length=512, max_predictions_per_seq=80),
    ),
}


def get_config(recipe: str = "adam"):
    config = common.base_config()
    config.model.num_layers = 24
    config.model.hidden_size = 1024
    config.model.num_heads = 16  # hidden / 64
    config.model.intermediate_size = 4096  # 4 * hidden
    config.model.scan_layers = True  # 24 blocks compiled once: pod compile time stays short
    # Keep the named matmul outputs, recompute the element-wise work (GELU, dropout, LayerNorm): batch
    # 256 x 128 then fits one 80 GB GPU (docs/performance.md has the compiled step's memory per policy).
    config.model.remat_policy = "save_named"
    recipes = {**common.DEVLIN_RECIPES, **LAMB_RECIPES}
    return common.apply_recipe(config, recipes, recipe, "configs/large.py")
