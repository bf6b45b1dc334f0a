"""Run embedtune CLI under a stack sampler; dump counts every 30 s to $SAMPLE_OUT."""
import collections, os, sys, threading, time, traceback
counts = collections.Counter(); leaf = collections.Counter(); main = threading.main_thread().ident
out = os.environ["SAMPLE_OUT"]; t0 = time.time()
def dump():
    with open(out, "w") as f:
        f.write(f"elapsed {time.time()-t0:.0f}s samples {sum(leaf.values())}\n== inclusive (top 60)\n")
        for k, v in counts.most_common(60): f.write(f"{v:6d} {k}\n")
        f.write("== leaf (top 30)\n")
        for k, v in leaf.most_common(30): f.write(f"{v:6d} {k}\n")
def loop():
    last = time.time()
    while True:
        time.sleep(0.5)
        fr = sys._current_frames().get(main)
        if fr is None: continue
        stack = traceback.extract_stack(fr)
        seen = set()
        for s in stack:
            if "embedtune" not in s.filename and s is not stack[-1]: continue
            key = f"{s.filename.split('src/')[-1]}:{s.name}:{s.lineno}"
            if key not in seen: counts[key] += 1; seen.add(key)
        s = stack[-1]; leaf[f"{s.filename.split('/')[-1]}:{s.name}:{s.lineno}"] += 1
        if time.time() - last > 30: dump(); last = time.time()
threading.Thread(target=loop, daemon=True).start()
import atexit; atexit.register(dump)
from embedtune.cli import main as cli_main
sys.argv = ["embedtune", *sys.argv[1:]]
sys.exit(cli_main())
