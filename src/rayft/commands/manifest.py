"""`rayft manifest`: render, check and validate the RayCluster / RayJob for a config, then write them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit


def manifest(
    config: ConfigArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the YAML files.")] = Path("manifests"),
    set_: SetOpt = None,
    crds: Annotated[
        Optional[Path],
        typer.Option(help="Folder with the KubeRay v1.7.0 CRDs (default: $RAYFT_KUBERAY_CRDS or ../shared/reference)."),
    ] = None,
    ec2: Annotated[
        bool,
        typer.Option("--ec2/--no-ec2", help="Ask EC2 DescribeInstanceTypes when AWS credentials are present."),
    ] = True,
) -> None:
    """Render the RayCluster and RayJob (plus ConfigMap, optional NetworkPolicy) for CONFIG's cluster."""
    from rayft.cluster.instances import NotAGpuInstanceError, UnknownInstanceTypeError, describe_instance_type, get_instance
    from rayft.cluster.manifest import ManifestError, build, write
    from rayft.cluster.manifest_schema import shared_reference_dir

    cfg = load_config_or_exit(config, set_)
    if cfg.cluster is None:
        console.print("[bold red]error[/]: cluster: the config has no cluster: section", highlight=False)
        raise typer.Exit(1)
    name = cfg.cluster.instance_type
    try:
        instance = describe_instance_type(name, region=cfg.cluster.aws.region) if ec2 else get_instance(name)
    except (UnknownInstanceTypeError, NotAGpuInstanceError) as e:
        console.print(f"[bold red]error[/]: cluster.instance_type: {e}", highlight=False)
        raise typer.Exit(1) from None
    crd_dir = crds or shared_reference_dir()
    try:
        m = build(cfg, instance, crd_dir=crd_dir)
    except ManifestError as e:
        console.print(f"[bold red]error[/]: {e}", highlight=False)
        raise typer.Exit(1) from None
    paths = write(m, out, cfg.cluster.kube.job_cluster, source=os.fspath(config))
    for note in m.notes:
        console.print(f"[yellow]note[/]: {note}", highlight=False)
    for warning in m.warnings:
        console.print(f"[bold yellow]warning[/]: {warning}", highlight=False)
    world = cfg.cluster.num_nodes * instance.gpu_count
    console.print(
        f"{cfg.cluster.num_nodes}× {instance.name} ({instance.gpu_count}× {instance.gpu_model}, "
        f"{instance.max_efa_interfaces if cfg.cluster.efa else 0} EFA per pod) = {world} workers "
        f"[dim](instance figures from {instance.origin})[/]",
        highlight=False,
    )
    for p in paths:
        console.print(f"wrote {p}", highlight=False)
