# usage: python3 locks.py CALLGRIND_OUT LIBSOP OPS -> sop's own instructions and locked
# instructions per operation, from a callgrind run with --dump-instr=yes --compress-pos=no
# --compress-strings=no (for the pair: count.sh's command in ../2026-11-30-sim-pair-instructions/
# with those options; OPS the pairs it made). An instruction is locked if it carries a lock
# prefix or is xchg with memory; a call into pthread's mutexes counts as one.
import collections
import os
import re
import subprocess
import sys

path, lib, ops = sys.argv[1], sys.argv[2], float(sys.argv[3])
ob = fn = None
skip = False
cost = collections.Counter()
fn_of = {}
for line in open(path):
    if line.startswith('ob='):
        ob = line[3:].strip()
    elif line.startswith('fn='):
        fn = line[3:].strip()
    elif line.startswith('calls='):
        skip = True  # the next cost line is the call's, inclusive
    else:
        m = re.match(r'^(0x[0-9a-f]+)\s+(\d+)\s+(\d+)', line)
        if m:
            if skip:
                skip = False
            elif ob and os.path.basename(ob).startswith('libsop.so'):
                a = int(m.group(1), 16)
                cost[a] += int(m.group(3))
                fn_of[a] = fn
dis = subprocess.run(['objdump', '-d', '--no-show-raw-insn', lib], capture_output=True,
                     text=True).stdout
ins = {}
for line in dis.splitlines():
    m = re.match(r'^\s+([0-9a-f]+):\s+(.*)$', line)
    if m:
        ins[int(m.group(1), 16)] = m.group(2)
total = locked = 0
rows = collections.Counter()
for a, c in cost.items():
    text = ins.get(a, '')
    words = text.split()
    total += c
    if words and (words[0] in ('lock', 'xchg') or 'pthread_mutex' in text):
        locked += c
        rows[(fn_of[a], text)] += c
print(f'sop instructions per op {total / ops:.1f}, locked {locked / ops:.2f}')
for (f, text), c in rows.most_common(12):
    print(f'{c / ops:6.2f}  {f[:40]:40s} {text}')
