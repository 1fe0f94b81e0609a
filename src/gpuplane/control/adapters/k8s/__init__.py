"""The Kubernetes adapter's pure parts: the API profile a server version gets (`versions`), HAMi's
node registration (`hami`) and the manifests a workload becomes (`manifests`); the watch that
keeps a cluster's objects current (`reflector`) is the one part that does I/O."""
