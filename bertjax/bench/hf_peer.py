"""The Hugging Face peer of the step benchmark: the transformers class a config converts to, trained in
PyTorch on the same batches (eager or torch.compile'd). torch and transformers are imported only when a
peer is built: the benchmark runs without them (--no_torch), and the library never needs them."""

import contextlib
import os
import time

import numpy as np

from bertjax.interop import hf
from bertjax.models.config import BertConfig


def torch_cuda_available() -> bool:
    try:
        import torch  # optional: the benchmark's peer only
    except ImportError:
        return False
    return torch.cuda.is_available()


# The label of the sentence head, by the HF class that has one (the masked-LM classes have none).
HF_SENTENCE_LABELS = {"BertForPreTraining": "next_sentence_label", "AlbertForPreTraining": "sentence_order_label",
                      "MobileBertForPreTraining": "next_sentence_label"}


def hf_peer_config(cfg: BertConfig) -> dict:
    """The config.json dict of the Hugging Face class that computes `cfg`'s network (its architectures[0])."""
    try:
        return hf.config_to_hf(cfg)  # its family's (hf.family_of_config)
    except ValueError as e:
        raise ValueError(f"{e}; no Hugging Face class to time beside it: run with --no_torch") from e


class HFStep:
    """The Hugging Face class of the config (hf_peer_config) in train mode with torch.optim.AdamW, on the
    same batches: MLM labels at the masked positions, the sentence label where the class has a sentence
    head, token types where the model has more than one.

    On the CPU: eager, float32. On a GPU: sdpa attention, bf16 autocast, fused AdamW, global-norm
    clipping 1.0, eager or torch.compile'd."""

    def __init__(self, hf_config: dict, batches: list, device: str = "cpu", compile: bool = False):
        import torch  # optional: the benchmark's peer only
        import transformers  # optional, as torch

        self.torch, self.device, self.compiled = torch, device, compile
        self.name = "HF compiled" if compile else "HF eager"
        if device == "cpu":
            torch.set_num_threads(os.cpu_count())
        torch.manual_seed(0)
        fields = {k: v for k, v in hf_config.items() if k not in ("model_type", "dtype", "torch_dtype")}
        architecture = self.architecture = fields["architectures"][0]
        config = transformers.AutoConfig.for_model(hf_config["model_type"], **fields, attn_implementation="sdpa")
        net = getattr(transformers, architecture)(config).to(device).train()
        self.params = sum(p.numel() for p in net.parameters())
        self.attention = getattr(net.config, "_attn_implementation", None) or "eager"
        self.threads = torch.get_num_threads()
        self.versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
        on_gpu = device != "cpu"
        self.opt = torch.optim.AdamW(net.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=on_gpu)
        self.params_list = list(net.parameters())
        self.net = torch.compile(net) if compile else net
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if on_gpu else contextlib.nullcontext
        sentence_label = HF_SENTENCE_LABELS.get(architecture)
        # RoBERTa's one segment and ModernBERT's none: bertjax reads no segment ids there either.
        token_types = hf_config.get("type_vocab_size", 0) > 1

        def to_torch(b):
            # MLM labels at every position, -100 (ignored) except at the masked ones.
            labels = np.full(b["input_ids"].shape, -100, np.int64)
            rows = np.arange(labels.shape[0])[:, None]
            labels[rows, b["masked_lm_positions"]] = np.where(b["masked_lm_weights"] > 0, b["masked_lm_ids"], -100)
            tensors = dict(input_ids=b["input_ids"], attention_mask=b["input_mask"], labels=labels)
            if token_types:
                tensors["token_type_ids"] = b["segment_ids"]
            if sentence_label:
                tensors[sentence_label] = b["next_sentence_labels"]
            return {k: torch.from_numpy(np.asarray(v).astype(np.int64)).to(device) for k, v in tensors.items()}

        self.batches = [to_torch(b) for b in batches]
        self.count, self._loss = 0, None
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()

    def _sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def step(self) -> float:
        batch = self.batches[self.count % len(self.batches)]
        self._sync()
        start = time.perf_counter()
        with self.autocast():
            loss = self.net(**batch).loss
        loss.backward()
        if self.device != "cpu":
            self.torch.nn.utils.clip_grad_norm_(self.params_list, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        self.count += 1
        self._loss = loss
        return time.perf_counter() - start

    def loss(self) -> float:
        return float(self._loss.detach().float())

    def reset_peak(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.reset_peak_memory_stats()

    def release(self) -> None:
        """The memory torch's allocator caches, returned to the device (parameters and optimizer state stay)."""
        if self.device != "cpu":
            self.torch.cuda.empty_cache()

    def peak_bytes(self) -> int | None:
        return int(self.torch.cuda.max_memory_allocated()) if self.device != "cpu" else None
