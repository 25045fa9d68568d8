"""The daemon's local control socket: the protocol (protocol.py), the daemon's server and methods
(server.py, methods.py, cache_methods.py), the one typed client (client.py) and the pid/lock files that say
whether a daemon is alive (pidfile.py).

The client side imports nothing heavy (no torch, no runtime): the CLI starts in a fraction of a second.
"""
