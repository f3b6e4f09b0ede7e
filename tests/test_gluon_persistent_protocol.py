"""A model of kernels/gluon_fwd_persistent.py's barrier protocol (kept in step with the kernel by hand): the loader warp
and the consumer warpgroups (two, or three with CONSUMERS=3) as generators that yield the mbarrier parity waits they
make, running counters for the ring / turn / Q phases across tiles of different lengths, TMA loads landing at random
later times. Random interleavings must finish (no deadlock) and every Q K^T / P V must read the block it expects (no
buffer overwritten early, no phase aliasing). Mutations of the kernel's counters (a per-tile reset, a constant Q
phase, no q_empty wait) made it fail when it was written (checked by hand then; the tests below keep three other
mutations). O_VIA_SMEM's epilogues: one O tile the two consumers take in turns (o_free, parity WG ^ 1); one parity
for both fails (test_o_tile_parity_mutation_fails). Three consumers store O without that
tile (O_TMA or registers), so their model has no o_free. Q_BUFFERS=2 (GluonConfig.q_buffers): tile t's Q in buffer
t % 2, loaded at the start of the loader's tile once tile t - 2 released that buffer; a loader that skips that wait
fails (test_two_q_buffers_without_the_release_wait_fails)."""

import random


class Bar:
    """An mbarrier: count arrivals complete a phase; wait(parity) passes once the phase of that parity completed
    (a fresh barrier passes wait(1), as the kernel's first lap relies on)."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0  # phase: phases completed so far

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        return (self.phase & 1) != parity


def run(tile_blocks, stages, pingpong=True, seed=0, o_parity=lambda wg: wg ^ 1, consumers=2, release_count=None,
        q_buffers=1, q_wait=True):
    """One CTA's tiles (tile_blocks: key blocks per tile) under a random interleaving; raises on a deadlock or a
    GEMM that would read the wrong block (or an epilogue whose O tile another one overwrote). o_parity(wg): the
    o_free parity an epilogue of consumer wg waits for (two consumers). release_count: the arrivals q_empty and the
    ring's empty barriers count (the kernel: consumers). q_buffers: the kernel's Q_BUFFERS; q_wait=False: the loader
    does not wait for q_empty (a mutation)."""
    rng = random.Random(seed)
    release = release_count or consumers
    q_bar, q_empty = [Bar(1) for _ in range(q_buffers)], [Bar(release) for _ in range(q_buffers)]
    k_ready, v_ready = [Bar(1) for _ in range(stages)], [Bar(1) for _ in range(stages)]
    k_empty, v_empty = [Bar(release) for _ in range(stages)], [Bar(release) for _ in range(stages)]
    turn = [Bar(1) for _ in range(consumers)]
    o_free, o_buf = Bar(1), [None]  # O_VIA_SMEM: the O tile and which (tile, warpgroup) wrote it
    k_buf, v_buf, q_buf = [None] * stages, [None] * stages, [None] * q_buffers  # which block / tile each buffer holds
    in_flight = []  # TMA loads issued, not landed: (barrier, buffer list, index, value)

    def loader():  # _load_partition_p
        c = 0
        for t, n in enumerate(tile_blocks):
            if q_buffers == 2:  # Q first, into buffer t % 2
                qb = t % 2
                if q_wait:
                    yield lambda: q_empty[qb].done(((t // 2) & 1) ^ 1)
                in_flight.append((q_bar[qb], q_buf, qb, t))
            for j in range(n):
                st, ph = c % stages, ((c // stages) & 1) ^ 1
                yield lambda: k_empty[st].done(ph)
                in_flight.append((k_ready[st], k_buf, st, c))
                if q_buffers == 1 and j == 0:
                    if q_wait:
                        yield lambda: q_empty[0].done((t & 1) ^ 1)
                    in_flight.append((q_bar[0], q_buf, 0, t))
                yield lambda: v_empty[st].done(ph)
                in_flight.append((v_ready[st], v_buf, st, c))
                c += 1

    def consumer(wg):  # _consumer_partition_p
        def turn_wait(cc):  # gluon_fwd_common._turn_wait: warpgroup 0 first
            return (lambda: turn[wg].done((cc & 1) ^ (wg == 0))) if pingpong else (lambda: True)

        def turn_pass():
            if pingpong:
                turn[(wg + 1) % consumers].arrive()

        c = 0
        for t, n in enumerate(tile_blocks):
            qb = t % q_buffers
            yield lambda: q_bar[qb].done((t // q_buffers) & 1)
            yield lambda: k_ready[c % stages].done((c // stages) & 1)
            yield turn_wait(c)
            assert q_buf[qb] == t and k_buf[c % stages] == c, ("S_0", wg, t, c, q_buf, k_buf)
            turn_pass()
            yield None  # the Q K^T runs
            assert q_buf[qb] == t and k_buf[c % stages] == c, ("S_0 read", wg, t, c, q_buf, k_buf)
            k_empty[c % stages].arrive()
            for j in range(1, n):
                cc = c + j
                yield lambda: k_ready[cc % stages].done((cc // stages) & 1)
                yield turn_wait(cc)
                assert q_buf[qb] == t and k_buf[cc % stages] == cc, ("S_j", wg, t, cc, q_buf, k_buf)
                yield lambda: v_ready[(cc - 1) % stages].done(((cc - 1) // stages) & 1)
                assert v_buf[(cc - 1) % stages] == cc - 1, ("PV", wg, t, cc - 1, v_buf)
                turn_pass()
                yield None  # S_j retires
                assert q_buf[qb] == t and k_buf[cc % stages] == cc, ("S_j read", wg, t, cc, q_buf, k_buf)
                k_empty[cc % stages].arrive()
                yield None  # the P V retires
                assert v_buf[(cc - 1) % stages] == cc - 1, ("PV read", wg, t, cc - 1, v_buf)
                v_empty[(cc - 1) % stages].arrive()
            q_empty[qb].arrive()
            last = c + n - 1
            yield lambda: v_ready[last % stages].done((last // stages) & 1)
            assert v_buf[last % stages] == last, ("last PV", wg, t, last, v_buf)
            yield None
            assert v_buf[last % stages] == last, ("last PV read", wg, t, last, v_buf)
            v_empty[last % stages].arrive()
            if consumers == 2:  # O_VIA_SMEM's shared O tile
                yield lambda: o_free.done(o_parity(wg))
                o_buf[0] = (t, wg)
                yield None  # the rows are read back
                assert o_buf[0] == (t, wg), ("O tile", wg, t, o_buf)
                o_free.arrive()
            c += n

    actors = [loader()] + [consumer(wg) for wg in range(consumers)]
    waits, finished = [None] * len(actors), [False] * len(actors)
    while not all(finished):
        ready = [i for i in range(len(actors)) if not finished[i] and (waits[i] is None or waits[i]())]
        if in_flight and (not ready or rng.random() < 0.3):
            bar, buf, idx, value = in_flight.pop(rng.randrange(len(in_flight)))
            buf[idx] = value
            bar.arrive()
            continue
        if not ready:
            raise RuntimeError(f"deadlock: tiles {tile_blocks}, stages {stages}")
        i = rng.choice(ready)
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            finished[i] = True


def test_persistent_protocol_random_schedules():
    for seed in range(400):
        rng = random.Random(seed)
        stages = rng.choice([1, 2, 3, 4])
        tiles = [rng.randint(1, 6) for _ in range(rng.randint(1, 8))]  # key blocks per tile of one CTA
        run(tiles, stages, pingpong=rng.random() < 0.8, seed=seed)


def test_o_tile_parity_mutation_fails():
    """Both consumers waiting for the same o_free parity (the fresh barrier passes the first wait of each): every
    interleaving fails, by a deadlock later or by one epilogue overwriting the other's O tile (some do the latter)."""
    overwrites = 0
    for seed in range(50):
        try:
            run([2, 3, 1], 2, seed=seed, o_parity=lambda wg: 1)
        except AssertionError as error:
            assert "O tile" in str(error), error
            overwrites += 1
        except RuntimeError as error:
            assert "deadlock" in str(error)
        else:
            raise AssertionError(f"seed {seed}: the mutated parity finished")
    assert overwrites > 0


def test_three_consumers_random_schedules():
    """CONSUMERS=3: the turn ring of three barriers and the releases counting three arrivals, random tiles."""
    for seed in range(300):
        rng = random.Random(seed)
        tiles = [rng.randint(1, 6) for _ in range(rng.randint(1, 8))]
        run(tiles, rng.choice([1, 2, 3, 4]), pingpong=rng.random() < 0.8, seed=seed, consumers=3)


def test_three_consumers_with_two_releases_fails():
    """q_empty and the ring's empty barriers completing at two of three consumers' arrivals (the two-consumer count
    left in place) let a load overwrite a buffer a consumer still reads: some interleavings fail."""
    failures = 0
    for seed in range(100):
        try:
            run([3, 2, 4, 1], 2, seed=seed, consumers=3, release_count=2)
        except (AssertionError, RuntimeError):
            failures += 1
    assert failures > 0


def test_two_q_buffers_random_schedules():
    """Q_BUFFERS=2 with two and three consumers, random tiles."""
    for seed in range(300):
        rng = random.Random(seed)
        tiles = [rng.randint(1, 6) for _ in range(rng.randint(1, 8))]
        run(tiles, rng.choice([1, 2, 3, 4]), pingpong=rng.random() < 0.8, seed=seed, consumers=rng.choice([2, 3]),
            q_buffers=2)


def test_two_q_buffers_without_the_release_wait_fails():
    """A loader that loads tile t's Q without waiting for tile t - 2's release overwrites a Q still in use, or
    completes a Q barrier's phase early (short tiles let it run two tiles ahead)."""
    failed = 0
    for seed in range(50):
        try:
            run([1, 1, 1, 1, 1, 1], 4, seed=seed, q_buffers=2, q_wait=False)
        except (AssertionError, RuntimeError):  # a Q read overwritten, or a deadlock
            failed += 1
    assert failed
