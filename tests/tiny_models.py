"""The tiny Llama and toy token data that the tests' own Hugging Face Trainer scripts train on
CPU, as source text for a script to include: `Toy(n)` holds n sequences of 8 tokens (their own
labels), `model` is a one-layer Llama with 16 hidden units, seeded. The script imports `torch`
and `LlamaConfig, LlamaForCausalLM` from transformers itself."""

from __future__ import annotations

import textwrap

TOY_DATA_AND_TINY_LLAMA = textwrap.dedent(
    """\

    class Toy(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            ids = torch.tensor([(i + k) % 60 + 2 for k in range(8)])
            return {"input_ids": ids, "labels": ids.clone()}


    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    """
)
