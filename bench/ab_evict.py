import sys
sys.argv=['x']
sys.path.insert(0,'bench')
from kernel_time import run
from vm.megakernel import Ablations
for i in range(2):
    for ab in (Ablations(), Ablations(evict_first=False)):
        r = run('llama-1b', 128, ab)
        print(f"{r['kernel_ms']:.3f} {r['generate_ms']:.3f} {r['verdict']} {r['ablations']}", flush=True)
