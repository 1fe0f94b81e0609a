"""The Kubernetes adapter's pure parts: the API profile a server version gets (`versions`), HAMi's
node registration (`hami`) and the manifests a workload becomes (`manifests`); the watch that
keeps a cluster's objects current (`reflector`), the connection with its watches (`watches`)
and the Pods' logs (`podlogs`) are the parts that do I/O."""
