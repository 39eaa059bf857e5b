"""The sentence-transformers peer of the embedding benchmark: SentenceTransformer.encode on the same
directory and texts, and MultipleNegativesRankingLoss trained by torch.optim.AdamW on the same batches.
torch and sentence-transformers are imported only when a peer is built: the benchmark runs without them
(--no_torch), and the library never needs them."""

import os
import time

import numpy as np


def available() -> bool:
    try:
        import sentence_transformers  # noqa: F401  (optional: the benchmark's peer only)
    except ImportError:
        return False
    return True


def _torch(device: str):
    import torch  # optional: the benchmark's peer only

    if device == "cpu":  # every core this process may run on (a `taskset` run: those), as XLA's threads
        torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    return torch


class STEmbedder:
    """SentenceTransformer(directory).encode(texts) in eval mode, float32."""

    name = "sentence-transformers"

    def __init__(self, directory: str, device: str = "cpu"):
        torch = _torch(device)
        import sentence_transformers  # optional, as torch

        self.torch, self.device = torch, device
        self.model = sentence_transformers.SentenceTransformer(directory, device=device)
        self.threads = torch.get_num_threads()
        self.versions = (f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, "
                         f"{self.threads} threads")

    def embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        return np.asarray(self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True), np.float32)


class STContrastiveStep:
    """sentence-transformers' MultipleNegativesRankingLoss on its own model (train mode: dropout on), a plain
    torch loop: the loss of a batch, backward, the config's global-norm clipping, torch.optim.AdamW (decay off
    for LayerNorm and biases, as bertjax's AdamW). Each column is padded to its own longest text, as
    sentence-transformers' collator pads it."""

    name = "sentence-transformers"

    def __init__(self, directory: str, batches: list[dict], *, scale: float, learning_rate: float, b1: float,
                 b2: float, eps: float, weight_decay: float, clip_norm: float, device: str = "cpu"):
        torch = _torch(device)
        import sentence_transformers  # optional, as torch
        from sentence_transformers.sentence_transformer import losses  # optional, as torch

        self.torch, self.device, self.clip_norm = torch, device, clip_norm
        model = sentence_transformers.SentenceTransformer(directory, device=device)
        model.train()
        self.loss_fn = losses.MultipleNegativesRankingLoss(model, scale=scale)
        named = list(model.named_parameters())
        decayed = lambda n: not ("LayerNorm" in n or "bias" in n)  # noqa: E731
        self.params = [p for _, p in named]
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for n, p in named if decayed(n)]},
             {"params": [p for n, p in named if not decayed(n)], "weight_decay": 0.0}],
            lr=learning_rate, betas=(b1, b2), eps=eps, weight_decay=weight_decay, foreach=True)

        def column(ids, mask):
            width = int(mask.sum(-1).max())  # the longest text of the column
            def as_long(x):
                return torch.from_numpy(np.ascontiguousarray(x[:, :width]).astype(np.int64)).to(device)

            return {"input_ids": as_long(ids), "attention_mask": as_long(mask), "token_type_ids": as_long(0 * ids)}

        self.batches = [[column(b["query_ids"], b["query_mask"]), column(b["passage_ids"], b["passage_mask"])]
                        for b in batches]
        self.labels = torch.zeros(len(batches[0]["query_ids"]), device=device)  # MNRL reads no labels
        self.count, self._loss = 0, None

    def _sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def step(self) -> float:
        batch = self.batches[self.count % len(self.batches)]
        self._sync()
        began = time.perf_counter()
        loss = self.loss_fn(batch, self.labels)
        loss.backward()
        if self.clip_norm:
            self.torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        self.count += 1
        self._loss = loss
        return time.perf_counter() - began

    def loss(self) -> float:
        return float(self._loss.detach())
