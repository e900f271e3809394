"""Resolve sampler output: per module, then per function and source line (addr2line) for the
modules named on the command line."""
import collections, subprocess, sys
maps, pcs = [], []
for l in open(sys.argv[1]):
    if l.startswith('M '):
        f = l[2:].split()
        if len(f) >= 6 and 'x' in f[1]:
            lo, hi = (int(x, 16) for x in f[0].split('-'))
            maps.append((lo, hi, int(f[2], 16), f[5]))
    elif l.startswith('P '):
        pcs.append(int(l[2:], 16))
want = sys.argv[2:]
mods = collections.Counter(); per = collections.defaultdict(list)
for pc in pcs:
    for lo, hi, off, path in maps:
        if lo <= pc < hi:
            mods[path] += 1
            if any(w in path for w in want):
                per[path].append(pc - lo + off)
            break
    else:
        mods['?'] += 1
tot = len(pcs)
print(f'{tot} samples')
for k, v in mods.most_common(12):
    print(f'{100*v/tot:6.2f}% {k}')
for path, offs in per.items():
    c = collections.Counter(offs)
    addrs = list(c)
    out = subprocess.run(['addr2line', '-f', '-C', '-i', '-e', path] + [hex(a) for a in addrs],
                         capture_output=True, text=True).stdout.split('\n')
    # with -i there may be several frames per address: resolve one at a time instead
    fn, ln = collections.Counter(), collections.Counter()
    for a in addrs:
        r = subprocess.run(['addr2line', '-f', '-e', path, hex(a)], capture_output=True, text=True).stdout.split('\n')
        fn[r[0]] += c[a]; ln[r[1].split('/')[-1].split(' ')[0]] += c[a]
    n = len(offs)
    print(f'== {path}: {n} samples ({100*n/tot:.1f}%)')
    for k, v in fn.most_common(25):
        print(f'  {100*v/tot:6.2f}% {k}')
    print('  -- lines')
    for k, v in ln.most_common(30):
        print(f'  {100*v/tot:6.2f}% {k}')
