#!/usr/bin/env python3
"""Summarise the TCP streams in a kpeer frame dump (run.sh KPEER_PCAP=FILE).

For each TCP connection of the guest (10.0.2.15) it prints, per direction:
bytes, data segments and their sizes, pure ACKs, the largest window the
other side advertised, bytes in flight when the sender sent (snd_nxt minus
the newest ACK it had seen), and pauses between data segments. Per
connection it gives the turnarounds seen from the guest's side: server
(a data segment in -> the guest's first data segment out) and client (the
guest's last data segment -> the next one in; that includes qemu's
network, the host's TCP and the client). For the
RDMA port (default 20049) it also walks the MPA stream and prints the FPDU
sizes and RDMAP opcodes (RFC 5044 s6: ULPDU length, pad, 4-byte CRC field;
RFC 5041 s4 DDP, RFC 5040 s4 RDMAP headers).

  tools/mpastat.py dump.pcap [--rdma-port 20049] [--since SEC] [--until UNIXTIME]
"""
import argparse
import collections
import struct
import sys

GUEST = bytes([10, 0, 2, 15])
OPS = {0: 'write', 1: 'readreq', 2: 'readresp', 3: 'send', 4: 'sendinv', 5: 'sendse', 6: 'sendseinv', 7: 'terminate'}


def frames(path):
    with open(path, 'rb') as f:
        hdr = f.read(24)
        if len(hdr) < 24:
            sys.exit('mpastat: %s: not a pcap' % path)
        magic = struct.unpack('<I', hdr[:4])[0]
        if magic == 0xa1b2c3d4:
            end, div = '<', 1e6
        elif magic == 0xd4c3b2a1:
            end, div = '>', 1e6
        elif magic == 0xa1b23c4d:
            end, div = '<', 1e9
        else:
            sys.exit('mpastat: %s: bad pcap magic %#x' % (path, magic))
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            sec, frac, incl, _ = struct.unpack(end + 'IIII', rec)
            data = f.read(incl)
            if len(data) < incl:
                return
            yield sec + frac / div, data


def tcp_segments(path):
    """Yields (t, src, sport, dst, dport, seq, ack, flags, win, opts, payload)."""
    for t, d in frames(path):
        if len(d) < 14 + 20 or d[12:14] != b'\x08\x00':
            continue
        ip = d[14:]
        ihl = (ip[0] & 15) * 4
        if ip[9] != 6 or len(ip) < ihl + 20:
            continue
        total = struct.unpack('>H', ip[2:4])[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport, seq, ack, off, flags, win = struct.unpack('>HHIIBBH', tcp[:16])
        doff = (off >> 4) * 4
        yield t, bytes(ip[12:16]), sport, bytes(ip[16:20]), dport, seq, ack, flags, win, tcp[20:doff], tcp[doff:]


def wscale(opts):
    i = 0
    while i < len(opts):
        k = opts[i]
        if k == 0:
            break
        if k == 1:
            i += 1
            continue
        if i + 1 >= len(opts):
            break
        n = opts[i + 1]
        if k == 3 and n == 3:
            return opts[i + 2]
        i += max(n, 2)
    return None


def mss(opts):
    i = 0
    while i + 1 < len(opts):
        k = opts[i]
        if k == 0:
            break
        if k == 1:
            i += 1
            continue
        if k == 2 and opts[i + 1] == 4:
            return struct.unpack('>H', opts[i + 2:i + 4])[0]
        i += max(opts[i + 1], 2)
    return None


class Dir:
    def __init__(self):
        self.isn = None
        self.next = None       # next in-order seq
        self.buf = bytearray()  # in-order payload (MPA walking)
        self.bytes = 0
        self.sizes = collections.Counter()
        self.acks = 0
        self.retrans = 0
        self.times = []         # (t, len) of data segments
        self.inflight = []
        self.peer_ack = None    # newest ACK from the other side
        self.peer_win = 0
        self.max_peer_win = 0
        self.wscale = None
        self.mss = None


def turnarounds(events):
    """Server and client turnarounds from (t, dir) data events, dir 1 =
    into the guest, 0 = out of it."""
    srv, cli = [], []
    prev = None
    for t, d in events:
        if prev is not None and prev[1] != d:
            (srv if d == 0 else cli).append(t - prev[0])
        prev = (t, d)
    return srv, cli


def pct(v, p):
    if not v:
        return 0
    s = sorted(v)
    return s[min(len(s) - 1, int(p * len(s)))]


def hist(c, n=6):
    tot = sum(c.values()) or 1
    return ', '.join('%d:%.0f%%' % (k, 100.0 * v / tot) for k, v in c.most_common(n))


def walk_mpa(buf):
    """FPDU sizes and opcodes of an MPA stream that starts with the MPA
    request or reply frame (RFC 5044 s7.1)."""
    sizes, ops, payload = collections.Counter(), collections.Counter(), collections.Counter()
    if buf[:16] not in (b'MPA ID Req Frame', b'MPA ID Rep Frame'):
        return None
    pdlen = struct.unpack('>H', buf[18:20])[0]
    i = 20 + pdlen
    while i + 4 <= len(buf):
        ulpdu = struct.unpack('>H', buf[i:i + 2])[0]
        total = 2 + ulpdu + (-(2 + ulpdu) % 4) + 4
        if i + total > len(buf):
            break
        ctrl, rdmap = buf[i + 2], buf[i + 3]
        op = OPS.get(rdmap & 15, str(rdmap & 15))
        hdr = 14 if ctrl & 0x80 else 18  # tagged: STag+TO; untagged: QN+MSN+MO
        if (rdmap & 15) == 1:
            hdr = 18 + 28  # Read Request header
        sizes[total] += 1
        ops[op] += 1
        payload[op] += max(0, ulpdu - hdr)
        i += total
    return sizes, ops, payload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('pcap')
    ap.add_argument('--rdma-port', type=int, default=20049)
    ap.add_argument('--since', type=float, default=0, help='count from SEC seconds after the first frame (or, if SEC is a Unix time, from then)')
    ap.add_argument('--until', type=float, default=0, help='stop at this Unix time (0: the end)')
    ap.add_argument('--gap', type=float, default=0.005, help='report pauses longer than this (s)')
    a = ap.parse_args()
    conns = collections.OrderedDict()
    events = collections.defaultdict(list)
    t0 = None
    for t, src, sp, dst, dp, seq, ack, flags, win, opts, pl in tcp_segments(a.pcap):
        if t0 is None:
            t0 = t if a.since < 1e9 else 0
        if a.until and t > a.until:
            break
        if src == GUEST:
            key, d = (sp, dp), 0
        elif dst == GUEST:
            key, d = (dp, sp), 1
        else:
            continue
        c = conns.setdefault(key, (Dir(), Dir()))
        me, other = c[d], c[1 - d]
        if flags & 0x02:  # SYN
            me.isn, me.next = seq, (seq + 1) & 0xffffffff
            me.wscale, me.mss = wscale(opts), mss(opts)
        if flags & 0x10:
            scale = (me.wscale or 0) if (other.wscale is not None and me.wscale is not None) else 0
            other.peer_ack = ack
            other.peer_win = win << scale
            other.max_peer_win = max(other.max_peer_win, other.peer_win)
        if t - t0 < a.since:
            if pl and me.next is not None and seq == me.next:
                me.buf += pl
                me.next = (seq + len(pl)) & 0xffffffff
            continue
        if not pl:
            if not flags & 0x07:
                me.acks += 1
            continue
        if me.next is None:
            continue
        if seq == me.next:
            me.buf += pl
            me.next = (seq + len(pl)) & 0xffffffff
        elif ((seq - me.next) & 0xffffffff) > 0x7fffffff:
            me.retrans += 1
            continue
        else:
            me.next = None  # hole: stop reassembly (not expected over slirp)
            continue
        events[key].append((t, d))
        me.bytes += len(pl)
        me.sizes[len(pl)] += 1
        me.times.append((t, len(pl)))
        if me.peer_ack is not None:
            me.inflight.append((me.next - me.peer_ack) & 0xffffffff)
    for (gport, hport), dirs in conns.items():
        srv, cli = turnarounds(events[(gport, hport)])
        if srv and cli:
            print('guest:%d peer:%d turnarounds (ms): server median %.2f p90 %.2f max %.1f; client median %.2f p90 %.2f max %.1f' % (
                gport, hport, 1e3 * pct(srv, 0.5), 1e3 * pct(srv, 0.9), 1e3 * max(srv),
                1e3 * pct(cli, 0.5), 1e3 * pct(cli, 0.9), 1e3 * max(cli)))
        for name, d in (('guest->host', dirs[0]), ('host->guest', dirs[1])):
            if not d.bytes:
                continue
            span = d.times[-1][0] - d.times[0][0] if len(d.times) > 1 else 0
            gaps = [b[0] - p[0] for p, b in zip(d.times, d.times[1:])]
            long_gaps = [g for g in gaps if g > a.gap]
            print('guest:%d peer:%d %s: %d bytes in %.2fs (%.1f MB/s), %d data segments (mean %d B; sizes %s), '
                  '%d pure ACKs back, %d retransmits, mss %s, wscale %s' % (
                      gport, hport, name, d.bytes, span, d.bytes / span / 1e6 if span else 0, len(d.times),
                      d.bytes // max(1, len(d.times)), hist(d.sizes), (dirs[1] if d is dirs[0] else dirs[0]).acks,
                      d.retrans, d.mss, d.wscale))
            print('   peer window max %d; in flight at send: median %d p90 %d max %d; pauses >%gms: %d totalling %.2fs (%.0f%% of span), longest %.3fs' % (
                d.max_peer_win, pct(d.inflight, 0.5), pct(d.inflight, 0.9), max(d.inflight or [0]),
                a.gap * 1e3, len(long_gaps), sum(long_gaps), 100 * sum(long_gaps) / span if span else 0, max(gaps or [0])))
            if gport == a.rdma_port:
                w = walk_mpa(bytes(d.buf))
                if w:
                    sizes, ops, payload = w
                    n = sum(sizes.values())
                    print('   MPA: %d FPDUs, mean %d B; sizes %s; opcodes %s; payload by opcode %s' % (
                        n, sum(k * v for k, v in sizes.items()) // max(1, n), hist(sizes),
                        dict(ops), dict(payload)))


if __name__ == '__main__':
    main()
