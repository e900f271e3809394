# frameworks.py FRAMEWORK: a short run of a real framework on its stream-ordered allocator (PyTorch
# with backend:cudaMallocAsync, CuPy's MemoryAsyncPool, JAX with cuda_async), printing its result
# and whether sop owns the memory it allocated (sop_pointer_get_pool, found in the process when
# the interposer is loaded; None without it). test/gpu-frameworks.sh runs it with and without
# sop-run and compares.
import ctypes, os, sys
which = sys.argv[1]
under_sop = os.environ.get("LD_PRELOAD", "").find("libsop-preload") >= 0

def sop_owns(ptr):
    try:
        lib = ctypes.CDLL(None)
        f = lib.sop_pointer_get_pool
    except (OSError, AttributeError):
        return None
    pool = ctypes.c_void_p()
    return f(ctypes.byref(pool), ctypes.c_void_p(ptr)) == 0

if which == "torch":
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(1)
    for step in range(30):
        n = int(torch.randint(16, 257, (1,), generator=g))
        x = torch.randn(n, 512, generator=g).cuda()
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    w = model[0].weight
    st = torch.cuda.memory_stats()
    print("torch: backend", torch.cuda.get_allocator_backend(), "loss %.6f" % loss.item(),
          "reserved", st.get("reserved_bytes.all.peak"), "sop owns weight:", sop_owns(w.data_ptr()))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.ones(1 << 20, device="cuda") * 2
    s.synchronize()
    print("torch: side stream sum", y.sum().item(), "sop owns:", sop_owns(y.data_ptr()))
elif which == "torch_train":
    # A small GPT-style model trained with sequence lengths that change every step (the shapes
    # real training gives an allocator), bf16 autocast, AdamW; torch.cuda.memory_stats() read as
    # PyTorch's tools read it.
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    D, V = 256, 1024
    layer = torch.nn.TransformerEncoderLayer(D, 4, 4 * D, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(V, D), "enc": torch.nn.TransformerEncoder(layer, 2),
                                 "head": torch.nn.Linear(D, V)}).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(3)
    losses = []
    for step in range(20):
        b = int(torch.randint(2, 9, (1,), generator=g))
        t = int(torch.randint(16, 257, (1,), generator=g))
        x = torch.randint(0, V, (b, t), generator=g).cuda()
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model["head"](model["enc"](model["emb"](x), mask=mask, is_causal=True))
        loss = F.cross_entropy(out.float().view(-1, V), x.view(-1))
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    stats_ok = (st.get("reserved_bytes.all.peak", 0) >= st.get("allocated_bytes.all.peak", 1) > 0 and
                torch.cuda.memory_reserved() > 0)
    print("torch_train: loss first %.4f last %.4f sum %.4f" % (losses[0], losses[-1], sum(losses)),
          "stats ok:", stats_ok, "sop owns weight:", sop_owns(model["head"].weight.data_ptr()))
elif which == "torch_graph":
    # torch.cuda.graph with the cudaMallocAsync backend: memory made before the capture is sop's
    # under sop-run, what the capture allocates is the driver's graph memory, and the replays
    # give the same results either way.
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).cuda()
    static_x = torch.zeros(256, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h = model(static_x)
        static_y = (h * h).sum(dim=1) + h.mean()
    g = torch.Generator(device="cpu").manual_seed(2)
    total = 0.0
    for i in range(50):
        static_x.copy_(torch.randn(256, 512, generator=g))
        graph.replay()
        total += float(static_y.sum().item())
    # The same computation without the graph, on the last input: the replay computed it.
    with torch.no_grad():
        h = model(static_x)
        direct = (h * h).sum(dim=1) + h.mean()
    torch.cuda.synchronize()
    same = bool(torch.allclose(direct, static_y, rtol=1e-4, atol=1e-4))
    print("torch_graph: total %.3f" % total, "replay matches:", same,
          "sop owns input:", sop_owns(static_x.data_ptr()))
    del graph
    torch.cuda.synchronize()
elif which == "torch_generate":
    # Hugging Face transformers: greedy generation from a small GPT-2 built from its config
    # (random weights, nothing downloaded), whose key-value cache grows by a token each step:
    # the allocation sizes of a serving loop.
    import torch, transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=256)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval()
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator(device="cpu").manual_seed(5)).cuda()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96,
                             do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    print("torch_generate: tokens", out.shape[1], "checksum", int(out.sum()), "last", " ".join(map(str, out[:, -1].tolist())),
          "sop owns output:", sop_owns(out.data_ptr()))
elif which == "torch_ddp":
    # PyTorch's DistributedDataParallel on two GPUs over NCCL, one process a rank (this program
    # again, as torch_ddp_rank; under sop-run the ranks inherit the interposer): training steps
    # whose gradients NCCL reduces in buckets the allocator gave, an all_reduce, and an all_reduce
    # captured in a CUDA graph and replayed, where NCCL registers the buffers it is given
    # (NCCL_GRAPH_REGISTER). Multicast stays off.
    import subprocess, tempfile
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    with tempfile.TemporaryDirectory() as tmp:
        ranks = [subprocess.Popen([sys.executable, sys.argv[0], "torch_ddp_rank", str(r), tmp + "/rdv"],
                                  env=env, stdout=subprocess.PIPE, text=True) for r in (0, 1)]
        outs = [r.communicate(timeout=240)[0] for r in ranks]
    if any(r.returncode for r in ranks):
        sys.exit("torch_ddp: a rank failed")
    print(outs[0].strip())
elif which == "torch_ddp_rank":
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, rdv = int(sys.argv[2]), sys.argv[3]
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="file://" + rdv, rank=rank, world_size=2, device_id=dev)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                    torch.nn.Linear(1024, 512)).cuda(), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(10 + rank)
    losses = []
    for step in range(20):
        n = int(torch.randint(16, 257, (1,), generator=g))
        x = torch.randn(n, 512, generator=g).cuda()
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    t = torch.tensor([sum(losses)], device=dev)
    dist.all_reduce(t)
    # An all_reduce captured in a graph, on memory allocated before the capture, replayed.
    buf = torch.full((1 << 20,), float(rank + 1), device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(buf)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(buf)
    replays = []
    for i in range(5):
        buf.fill_(float(rank + 1 + i))
        graph.replay()
        replays.append(float(buf[0].item()) + float(buf[-1].item()))
    w = model.module[0].weight
    owns = torch.tensor([int(bool(sop_owns(w.data_ptr()))), int(bool(sop_owns(buf.data_ptr())))], device=dev)
    dist.all_reduce(owns)
    # DDP keeps the ranks' parameters equal: the same checksum on both.
    cs = torch.stack([sum(p.double().sum() for p in model.module.parameters())] * 2)
    dist.all_reduce(cs[0:1], op=dist.ReduceOp.MAX)
    dist.all_reduce(cs[1:2], op=dist.ReduceOp.MIN)
    del graph
    torch.cuda.synchronize()
    if rank == 0:
        print("torch_ddp: loss sum %.4f" % t.item(), "replays", " ".join("%.1f" % v for v in replays),
              "ranks in step:", bool(cs[0].item() == cs[1].item()),
              "sop owns weights/buffer on both ranks:", bool(owns[0].item() == 2 and owns[1].item() == 2) if under_sop else None)
    dist.destroy_process_group()
elif which == "cupy":
    import cupy as cp
    cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    rs = cp.random.RandomState(0)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    total = 0.0
    for i in range(200):
        with streams[i % 4]:
            n = 1000 + (i * 37) % 3000
            a = rs.standard_normal((n,), dtype=cp.float32)
            total += float((a * a).sum())
    for s in streams: s.synchronize()
    b = cp.arange(1 << 20, dtype=cp.float32)
    print("cupy: total %.3f" % total, "sop owns:", sop_owns(b.data.ptr))
elif which == "jax":
    import jax, jax.numpy as jnp
    @jax.jit
    def f(x): return jnp.tanh(x @ x.T).sum()
    tot = 0.0
    for n in (128, 256, 512, 1024, 256):
        x = jnp.ones((n, n), dtype=jnp.float32) / n
        tot += float(f(x))
    y = jnp.ones((1 << 20,), dtype=jnp.float32)
    ptr = y.unsafe_buffer_pointer() if hasattr(y, "unsafe_buffer_pointer") else None
    print("jax: total %.4f" % tot, "sop owns:", sop_owns(ptr) if ptr else "n/a")
