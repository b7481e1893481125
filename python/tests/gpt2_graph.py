"""A GPT-2 training step (transformers config, random weights) run eagerly or
captured whole in a CUDA graph and replayed, with PyTorch's allocator or
gpumalloc. Prints one JSON line with the losses of steps 3..22 (three
warm-up steps on a side stream, as PyTorch's graph documentation asks, then
20 steps: eager steps, or 20 replays of the captured step).

    python python/tests/gpt2_graph.py --allocator ours --mode graph
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["default", "ours"], required=True)
    ap.add_argument("--mode", choices=["eager", "graph"], required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--attn", default="sdpa")
    a = ap.parse_args()
    if a.allocator == "ours":
        import gpumalloc_torch

        gpumalloc_torch.enable()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = GPT2Config(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation=a.attn).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=(a.mode == "graph"))
    gen = torch.Generator().manual_seed(1)
    total = 3 + a.steps
    data = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen) for _ in range(total)]
    static = torch.empty(a.batch, a.seq, dtype=torch.long, device="cuda")
    losses = []

    def step():
        out = model(input_ids=static, labels=static)
        out.loss.backward()
        opt.step()
        return out.loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            static.copy_(data[i])
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    if a.mode == "eager":
        for i in range(3, total):
            static.copy_(data[i])
            opt.zero_grad(set_to_none=True)
            losses.append(float(step()))
    else:
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = step()
        for i in range(3, total):
            static.copy_(data[i])
            g.replay()
            losses.append(float(static_loss))
    torch.cuda.synchronize()
    print(json.dumps({"allocator": a.allocator, "mode": a.mode, "losses": losses}))


if __name__ == "__main__":
    main()
