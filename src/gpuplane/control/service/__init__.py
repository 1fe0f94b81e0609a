"""The control service: ControlService (wiring and tick) over intake, the cycle writer, the binder,
clusters, moves and the inventory sync."""
