import gpuplane


def test_public_surface_is_exactly_all() -> None:
    public = {n for n in dir(gpuplane) if not n.startswith("_")} - {
        "config",
        "errors",
        "resources",
        "serve",
        "engines",
        "batch",
        "control",
        "cli",
        "logs",
        "averages",
        "sections",
        "secrets",
        "audit",
        "plane",
        "console",
    }
    assert public <= set(gpuplane.__all__)
    for name in gpuplane.__all__:
        assert getattr(gpuplane, name) is not None
