"""Defaults of general distillation (python -m bertjax.distill): DistilBERT's recipe (Sanh et al. 2019,
section 3, and the training script published with it). Each configs/distill/<recipe>.py starts from
distill_config() and writes out what differs.

The sections are pretraining's (configs/common.py: the same stream, mesh, checkpoints and logging) plus
`distill`. With distill.student_layers set, the student is the teacher's architecture with those layers
(the model section's size fields are not read, only how it computes: dtype, attention_impl, remat_policy,
scan_layers, dropout); with student_layers=() it is the model section as written, fresh or from
train.init_from.
"""

import ml_collections
from ml_collections import config_dict

from configs import common

# DistilBERT's extraction from BERT-Base: every other layer, the first and the last kept.
DISTILBERT_LAYERS = (0, 2, 4, 7, 9, 11)


def layer_losses() -> dict:
    """The intermediate-layer losses (all 0: none), the keys general and task distillation share: TinyBERT's
    (Jiao et al. 2020; configs/distill/tinybert.py) and BERT-PKD's (Sun et al. 2019)."""
    return dict(
        # MSE(E_student W_e, E_teacher) of the embedding outputs (real tokens); W_e learned where the student
        # is narrower (general distillation), the identity at the same width.
        alpha_embedding=0.0,
        # sum over student layers m of MSE(H_m W_h, H_teacher g(m)); one W_h for every layer, as W_e.
        alpha_hidden=0.0,
        # sum over m of the MSE of the attention scores before softmax (model.attention_impl=xla; the same
        # head count in both), the masked entries zeroed as TinyBERT's code does.
        alpha_attention=0.0,
        # BERT-PKD: sum over the student's first M - 1 layers of ||h/||h|| - h_T/||h_T|| ||^2 on [CLS] (beta).
        alpha_pkd=0.0,
        # g(m), the teacher layer student layer m (1..M) learns from (0 = embeddings -> 0): "uniform"
        # (TinyBERT, m N / M), "skip" (PKD-skip, the same), "last" (PKD-last, N - M + m), or a tuple of M
        # teacher layers, 1-indexed: --config.distill.layer_map="(3,6,9,12)".
        layer_map=config_dict.FieldReference("uniform", field_type=object),
    )


def progressive_transfer() -> dict:
    """MobileBERT's progressive knowledge transfer (Sun et al. 2020; configs/distill/mobilebert.py), off by
    default: one stage per student layer, then pre-training distillation; the stage is a function of the step."""
    return dict(
        # On: a fresh student of the teacher's depth, width between layers and heads, its embedding and heads
        # copied from the teacher; train.num_steps = model.num_layers x stage_steps + pd_steps.
        progressive=False,
        stage_steps=0,  # steps of each layer's stage: layer l learns teacher layer l, the layers above untrained
        pd_steps=0,  # steps of the last stage, pre-training distillation (every parameter; schedule section's lr)
        stage_warmup_steps=0,  # each layer stage's linear warmup of the learning rate (0: none)
        lower_layers_lr=0.0,  # the layers below a stage's, at this x the learning rate (0: frozen, the paper's)
        alpha_fmt=1.0,  # feature-map transfer: MSE of layer l's outputs (real tokens)
        alpha_at=1.0,  # attention transfer: KL(teacher || student) of each head's attention, real queries
        pd_alpha=0.5,  # PD: pd_alpha x MLM + (1 - pd_alpha) x KD (distill.temperature) + the sentence task
    )


def distill_config() -> ml_collections.ConfigDict:
    config = common.base_config()
    config.distill = ml_collections.ConfigDict(dict(
        # A bertjax pretraining workdir or a Hugging Face BERT directory with its masked-LM head.
        teacher=config_dict.placeholder(str),
        # Student layer i starts as teacher layer student_layers[i]; embeddings, pooler and heads are
        # copied. () : a fresh student of the model section (any width; then alpha_cos=0 if it differs).
        student_layers=DISTILBERT_LAYERS,
        temperature=2.0,  # T of the soft targets; their loss is scaled by T^2
        alpha_ce=5.0,  # soft cross-entropy with the teacher's masked-LM distribution (at the masked positions)
        alpha_mlm=2.0,  # the masked-LM loss on the labels
        alpha_cos=1.0,  # 1 - cosine between the student's and the teacher's last hidden states (real tokens)
        alpha_nsp=0.0,  # the sentence task of data.objective (nsp | sop); DistilBERT drops it
        **layer_losses(),
        **progressive_transfer(),
    ))
    # DistilBERT drops next-sentence prediction: rows of full sentences, masked LM only.
    config.data.objective = "none"
    # Its optimizer: Adam (with bias correction), eps 1e-6, no weight decay, clipping at 5.0, lr 5e-4
    # after a warmup of 5% of the steps, then linear decay.
    config.optimizer.update(name="adamw", learning_rate=5e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0,
                            bias_correction=True, clip_norm=5.0)
    return config
