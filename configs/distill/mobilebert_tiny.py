"""MobileBERT-Tiny (configs/mobilebert_tiny.py) by progressive knowledge transfer from IB-BERT-Tiny
(configs/ibbert_tiny.py) on the built-in demo corpus, in minutes on a CPU.

  python -m bertjax.train --config=configs/ibbert_tiny.py --workdir=/tmp/bertjax-ibbert-tiny
  python -m bertjax.distill --config=configs/distill/mobilebert_tiny.py \
      --config.distill.teacher=/tmp/bertjax-ibbert-tiny --workdir=/tmp/bertjax-mobilebert-tiny-pkt

configs/distill/mobilebert.py made small: the student fresh, with the teacher's embedding and heads; 4 layer
stages of 100 steps (each warming up over 10), layer l learning the MSE of the teacher's layer-l feature map
(128 wide in both; 256 inside the teacher's layers, 64 inside the student's) and the KL of its 2 heads'
attention, the layers below frozen; then 200 steps of pre-training distillation (0.5 x MLM + 0.5 x KD + NSP)
over every parameter. Rows of 64 tokens, batches of 32, Adam at 1e-3. The console says each stage as it
starts; the workdir reads as any pretraining workdir (bertjax.load, fine-tuning's train.init_from).
Measured on a busy 2-core CPU from ibbert_tiny.py's 600 steps: 4.7 min; held-out masked-LM accuracy 15.7% after
the layer stages, 17.6% at the end (MobileBERT-Tiny pretrained alone on the same 600 batches: 16.1%).
"""

from configs import mobilebert_tiny
from configs.distill import common


def get_config():
    config = common.distill_config()
    config.model = mobilebert_tiny.get_config().model  # the student, written out in configs/mobilebert_tiny.py
    config.model.update(attention_impl="xla", hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    config.distill.student_layers = ()
    config.distill.update(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, progressive=True, stage_steps=100,
                          pd_steps=200, stage_warmup_steps=10, lower_layers_lr=0.0, alpha_fmt=1.0, alpha_at=1.0,
                          pd_alpha=0.5, temperature=1.0)
    config.data.update(objective="nsp", vocab_size=8192, eval_fraction=0.05, max_seq_length=64,
                       max_predictions_per_seq=10)
    config.optimizer.update(learning_rate=1e-3, bias_correction=True)
    config.schedule.update(warmup_steps=20, decay="linear")  # the pre-training distillation stage's
    config.train.update(batch_size=32, num_steps=4 * 100 + 200)
    config.checkpoint.every_steps = 100
    config.logging.update(log_every=25, eval_every=200, eval_batches=10)
    return config
