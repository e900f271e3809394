#!/usr/bin/env python3
"""Resolve warm.c's samples (SAMPLE=FILE) to functions and source lines with addr2line.
sample.py FILE [TOP]: the share of samples by function, then the hottest lines."""
import bisect, collections, subprocess, sys
path = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
samples, maps = [], []
for line in open(path):
    if line.startswith('S '):
        samples.append(int(line[2:], 16))
    elif line.startswith('M '):
        f = line[2:].split()
        if len(f) >= 6 and 'x' in f[1]:
            lo, hi = (int(x, 16) for x in f[0].split('-'))
            maps.append((lo, hi, int(f[2], 16), f[5]))
maps.sort(); starts = [m[0] for m in maps]
by_obj = collections.defaultdict(list)
for a in samples:
    i = bisect.bisect_right(starts, a) - 1
    if i >= 0 and maps[i][0] <= a < maps[i][1]:
        lo, hi, off, obj = maps[i]
        by_obj[obj].append(a - lo + off)
    else:
        by_obj['?'].append(a)
n = len(samples) or 1
funcs, lines = collections.Counter(), collections.Counter()
hot = collections.Counter()
for obj, offs in by_obj.items():
    uniq = sorted(set(offs))
    names = {}
    if obj.startswith('/') and ('libsop' in obj or obj.endswith('/warm')):
        out = subprocess.run(['addr2line', '-f', '-i', '-C', '-e', obj] + [hex(o) for o in uniq],
                             capture_output=True, text=True).stdout.split('\n')
        # With -i, inlined frames add pairs; take the first function and line of each address.
        out2 = subprocess.run(['addr2line', '-f', '-C', '-e', obj] + [hex(o) for o in uniq],
                              capture_output=True, text=True).stdout.split('\n')
        for k, o in enumerate(uniq):
            names[o] = (out2[2 * k], out2[2 * k + 1].split('/')[-1])
    elif obj.startswith('/'):
        # No line tables: the nearest dynamic symbol below each address.
        syms = []
        for l in subprocess.run(['nm', '-D', '--defined-only', obj], capture_output=True,
                                text=True).stdout.split('\n'):
            f = l.split()
            if len(f) == 3 and f[1] in 'TtWi':
                syms.append((int(f[0], 16), f[2]))
        syms.sort(); addrs = [a for a, _ in syms]
        for o in uniq:
            j = bisect.bisect_right(addrs, o) - 1
            names[o] = (syms[j][1] if j >= 0 else '?', '')
    short = obj.split('/')[-1]
    for o in offs:
        fn, ln = names.get(o, ('', ''))
        funcs[f'{short}:{fn}'] += 1
        if ln:
            lines[f'{short}:{ln} ({fn})'] += 1
            hot[(obj, o)] += 1
print(f'{len(samples)} samples')
for k, v in funcs.most_common(top):
    print(f'{100 * v / n:6.2f}%  {k}')
print('--- lines')
for k, v in lines.most_common(top):
    print(f'{100 * v / n:6.2f}%  {k}')
print('--- hottest addresses, with their inline chains (innermost first)')
for (obj, o), v in hot.most_common(top // 2):
    out = subprocess.run(['addr2line', '-f', '-i', '-C', '-e', obj, hex(o)], capture_output=True,
                         text=True).stdout.split('\n')
    frames = [f"{out[i]}@{out[i + 1].split('/')[-1]}" for i in range(0, len(out) - 1, 2)]
    print(f'{100 * v / n:6.2f}%  {hex(o)}  ' + ' < '.join(frames))
