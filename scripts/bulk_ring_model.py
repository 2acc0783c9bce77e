#!/usr/bin/env python3
"""Random-interleaving model of gemv_bulk_kernel's ring protocol (src/ops/cuda/gemv/gemv.cu: mbarrier
full / empty pairs per stage, warp 0 both consumer and producer, rounds numbered across token
passes, a dense launch's first rounds issued before the PDL wait). Each warp is a generator that
yields while it waits; copies complete in random order. Fails on a hang (no progress) or a warp
reading a stage whose last completed copy is not its round. A wrong wait parity makes it fail at
once, so it checks the protocol, not the kernel's arithmetic. Usage: bulk_ring_model.py"""
import random

class Bar:
    def __init__(self, count):
        self.count, self.arr, self.tx, self.phase = count, 0, 0, 0
    def _check(self):
        if self.arr == self.count and self.tx == 0:
            self.phase += 1; self.arr = 0
    def arrive(self):
        self.arr += 1; self._check()
    def expect(self, b):
        self.tx += b; self.arr += 1; self._check()
    def complete(self, b):
        self.tx -= b; self._check()
    def done(self, parity):  # try_wait.parity: the phase with this parity has completed
        return (self.phase & 1) != parity

def run(S, R, passes, early, seed, W=8):
    rng = random.Random(seed)
    full = [Bar(1) for _ in range(S)]; empty = [Bar(W) for _ in range(S)]
    filled = [None] * S      # round whose copy completed last into the stage
    inflight = []            # (stage, round, bytes) copies not yet complete
    loaded_round = [None] * S  # round the last issue targeted
    # Per-warp programs as generators of "steps"; a step yields a predicate to wait on (or None).
    def issue(gr):
        s = gr % S
        if gr >= S:
            p = ((gr // S) - 1) & 1
            while not empty[s].done(p):
                yield 'wait'
        full[s].expect(2)
        loaded_round[s] = gr
        inflight.append((s, gr, 1)); inflight.append((s, gr, 1))
        yield None
    def warp(w):
        gr0 = 0
        if w == 0 and early:
            for i in range(min(R, S)):
                yield from issue(i)
        for tt in range(passes):
            if w == 0 and not (tt == 0 and early):
                for i in range(min(R, S)):
                    yield from issue(gr0 + i)
            yield ('sync', tt, 0)
            for i in range(R):
                gr = gr0 + i; s = gr % S
                while not full[s].done((gr // S) & 1):
                    yield 'wait'
                assert filled[s] == gr, f"warp {w} round {gr} read stage {s} holding {filled[s]}"
                yield None
                empty[s].arrive()
                if w == 0 and i + S < R:
                    yield from issue(gr + S)
            gr0 += R
            yield ('sync', tt, 1)
    progs = [warp(w) for w in range(W)]
    state = [None] * W  # pending yield value
    at_sync = {}
    alive = set(range(W))
    steps = 0
    while alive:
        steps += 1
        if steps > 200000: raise RuntimeError("no progress (hang)")
        # complete a random in-flight copy sometimes
        if inflight and rng.random() < 0.5:
            k = rng.randrange(len(inflight)); s, gr, b = inflight.pop(k)
            full[s].complete(b)
            if not any(x[0] == s and x[1] == gr for x in inflight):
                filled[s] = gr
            continue
        w = rng.choice(sorted(alive))
        if isinstance(state[w], tuple):  # waiting at a barrier for all warps
            key = state[w][1:]
            if sum(1 for v in state if isinstance(v, tuple) and v[1:] == key) + (len(range(W)) - len(alive)) < W:
                if not inflight: pass
                continue
            for v in range(W):
                if isinstance(state[v], tuple) and state[v][1:] == key: state[v] = None
            continue
        try:
            state[w] = next(progs[w])
        except StopIteration:
            alive.discard(w); state[w] = 'end'
    return True

fails = 0
for S in (2, 3, 4):
    for R in (1, 2, 3, 4, 5, 7, 10):
        for passes in (1, 2, 3):
            for early in (False, True):
                if early and passes > 1: continue
                for seed in range(40):
                    try:
                        run(S, R, passes, early, seed)
                    except Exception as e:
                        fails += 1
                        if fails < 5: print("FAIL", S, R, passes, early, seed, e)
print("failures:", fails)
