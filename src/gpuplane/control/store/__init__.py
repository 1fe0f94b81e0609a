"""The control plane's store: the database, its tables and migrations, the estate mirror, the
records written on it and the read models (queries, views) answered from it."""
