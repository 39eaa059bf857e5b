"""MobileBERT (Sun et al. 2020) by progressive knowledge transfer from IB-BERT-Large (configs/ibbert.py): 24
stages, one per layer, of feature-map and attention transfer, then pre-training distillation.

  python -m bertjax.train --config=configs/ibbert.py --workdir=$TEACHER
  python -m bertjax.distill --config=configs/distill/mobilebert.py --config.distill.teacher=$TEACHER \
      --config.data.source=text --config.data.input_pattern='/data/wiki/*.txt' --workdir=$WORKDIR

The student is configs/mobilebert.py's network, fresh, with the teacher's embedding and heads copied in (the
widths match: 128-wide trigram words, 512-wide feature maps). Stage l (10,000 steps) trains layer l alone on
the MSE of its output against the teacher's layer l and the KL of its 4 heads' attention, warming up over
its first 1,000 steps; the layers below are frozen, the embedding and heads too. The last stage (500,000
steps, a 10,000-step warmup, then linear decay) trains everything on 0.5 x MLM + 0.5 x KL to the teacher's
masked-LM distribution (T = 1) + NSP. The schedule, LAMB at 1.5e-3 (without bias correction), batch 2,048
and the sequences of 512 are the published code's (google-research/mobilebert's README command: 240,000
layer-wise steps, 500,000 more); so are the student without dropout and each layer stage's warmup over its
first 10%. That code also tunes the layers below at 0.1 x the learning rate, the paper's softened variant:
--config.distill.lower_layers_lr=0.1. The feature-map loss here is the plain MSE of the paper's formula
(the code's adds normalised maps and mean and variance terms: compression/progressive.py).
"""

from configs import mobilebert
from configs.distill import common


def get_config():
    config = common.distill_config()
    config.model = mobilebert.get_config().model  # the student, written out in configs/mobilebert.py
    config.model.update(attention_impl="xla",  # attention transfer reads the scores, which only XLA's has
                        hidden_dropout_rate=0.0, attention_dropout_rate=0.0)  # as the published distillation
    config.distill.student_layers = ()  # a fresh student: its embedding and heads come from the teacher
    config.distill.update(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, progressive=True, stage_steps=10_000,
                          pd_steps=500_000, stage_warmup_steps=1_000, lower_layers_lr=0.0, alpha_fmt=1.0,
                          alpha_at=1.0, pd_alpha=0.5, temperature=1.0)
    config.data.update(objective="nsp", max_seq_length=512, max_predictions_per_seq=20, vocab_size=30522)
    config.optimizer.update(name="lamb", learning_rate=1.5e-3, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                            bias_correction=False, clip_norm=1.0)  # the published LAMB: no bias correction
    config.schedule.update(warmup_steps=10_000, decay="linear")  # the pre-training distillation stage's
    config.train.update(batch_size=2048, grad_accum_steps=8, num_steps=24 * 10_000 + 500_000)
    config.checkpoint.every_steps = 10_000
    config.logging.update(log_every=100, eval_every=10_000)
    return config
