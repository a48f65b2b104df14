#!/usr/bin/env python3
"""Run a shell command in the kpeer guest via its unauthenticated control
shell (busybox nc -ll -e on guest :22, forwarded by qemu to the host port
KPEER_SHELL_PORT, default 22022).

  KPEER_SHELL_PORT=22022 tools/gexec.py 'dmesg | grep siw'
"""
import os
import socket
import sys

cmd = ' '.join(sys.argv[1:]) or 'uname -a'
port = int(os.environ.get('KPEER_SHELL_PORT', '22022'))
s = socket.create_connection(('127.0.0.1', port), timeout=30)
s.sendall((cmd + '\nexit\n').encode())
out = b''
while True:
    try:
        b = s.recv(65536)
    except socket.timeout:
        break
    if not b:
        break
    out += b
sys.stdout.write(out.decode('utf-8', 'replace'))
