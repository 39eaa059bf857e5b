"""DistilBERT (Sanh et al. 2019): BERT-Base, 12 layers, distilled into 6 of its own (0, 2, 4, 7, 9, 11).

  python -m bertjax.distill --config=configs/distill/distilbert.py \
      --config.distill.teacher=/models/bert-base-uncased --config.data.source=text \
      --config.data.input_pattern='/data/wiki/*.txt' --workdir=$WORKDIR

The teacher is a bertjax BERT-Base workdir (configs/base.py) or a Hugging Face bert-base-uncased
directory with its pretraining heads; its vocabulary reads the text. The published run: batches of about
4K sequences of up to 512 tokens, 3 epochs of English Wikipedia and BookCorpus (about 90 hours on 8
V100s); the student keeps 97% of the teacher's GLUE score at 60% of its inference time.
"""

from configs.distill import common


def get_config():
    config = common.distill_config()
    config.distill.student_layers = common.DISTILBERT_LAYERS
    # The student is 6 layers of the teacher; these say what it is for the planner and the reader.
    config.model.update(num_layers=6, hidden_size=768, num_heads=12, intermediate_size=3072)
    config.data.update(max_seq_length=512, max_predictions_per_seq=80, max_sequences_per_row=16)
    config.train.update(batch_size=4096, grad_accum_steps=16, num_steps=100_000)
    config.schedule.update(warmup_steps=5_000, decay="linear")  # 5% of the steps
    config.checkpoint.every_steps = 1000
    config.logging.update(log_every=100, eval_every=1000)
    return config
