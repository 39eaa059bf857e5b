"""TinyBERT-4 (Jiao et al. 2020): general distillation of BERT-Base into 4 layers, hidden 312, FFN 1200,
12 heads (14.5M parameters).

  python -m bertjax.distill --config=configs/distill/tinybert.py \
      --config.distill.teacher=/models/bert-base-uncased --config.data.source=text \
      --config.data.input_pattern='/data/wiki/*.txt' --workdir=$WORKDIR

The student is fresh; it learns the teacher's embedding outputs and its layers 3, 6, 9 and 12 (g(m) = 3m)
through learned projections 312 -> 768 (W_e, W_h), and those layers' attention scores before softmax (12
heads each, head for head). The published general distillation uses only these intermediate losses,
no prediction loss. The published run: English Wikipedia, sequences of 128, 3 epochs, batch 256, lr 1e-4
(the released general_distill.py's defaults).

Then task distillation on each task (TinyBERT's second stage), from BERT-Base fine-tuned on the task
(FT_TEACHER, a fine-tuning workdir): the same intermediate losses through fresh projections 312 -> 768,
trained in the fine-tuning step (saved beside the optimizer state, never with the model), with the
teacher's soft targets (alpha=1: no gold labels, as published; the published first stage leaves out the
soft targets, which here are always on), then the prediction layer alone from that run:

  python -m bertjax.finetune --config=configs/finetune/classification.py --config.train.init_from=$WORKDIR \
      --config.distill.teacher=FT_TEACHER --config.distill.alpha=1 --config.distill.temperature=1 \
      --config.distill.alpha_hidden=1 --config.distill.alpha_embedding=1 --config.distill.alpha_attention=1 \
      --config.model.attention_impl=xla --config.data.packing=False \
      --config.data.train=train.jsonl --config.data.validation=dev.jsonl --workdir=$TASK/layers
  python -m bertjax.finetune --config=configs/finetune/classification.py --config.train.init_from=$TASK/layers \
      --config.distill.teacher=FT_TEACHER --config.distill.alpha=1 --config.distill.temperature=1 \
      --config.data.train=train.jsonl --config.data.validation=dev.jsonl --workdir=$TASK/prediction
"""

from configs.distill import common


def get_config():
    config = common.distill_config()
    config.distill.student_layers = ()  # a fresh student of the model section below
    config.distill.update(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, alpha_embedding=1.0, alpha_hidden=1.0,
                          alpha_attention=1.0, layer_map="uniform")
    config.model.update(num_layers=4, hidden_size=312, num_heads=12, intermediate_size=1200,
                        attention_impl="xla")  # the scores before softmax exist only in XLA's attention
    config.data.update(max_seq_length=128, max_predictions_per_seq=20)
    config.optimizer.update(learning_rate=1e-4, weight_decay=0.01)  # BertAdam, as released
    config.train.update(batch_size=256, num_steps=400_000)
    config.schedule.update(warmup_steps=40_000, decay="linear")  # 10% of the steps
    config.checkpoint.every_steps = 5000
    config.logging.update(log_every=100, eval_every=5000)
    return config
