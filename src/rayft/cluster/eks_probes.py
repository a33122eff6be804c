"""Read-only probes of what exists on AWS for a cluster (EKS, CloudFormation, EC2 through boto3):
the cluster's and node groups' states, a stack's state and failure reasons, the cluster's private
subnets and who owns it. :data:`NOT_FOUND` stands for absent.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from rayft.cluster.capacity import TAG_CLUSTER

NOT_FOUND = "NOT_FOUND"
#: CloudFormation states that hold no running resources and block a re-create with the same name.
FAILED_STACK_STATES = {"ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "CREATE_FAILED", "DELETE_FAILED", "UPDATE_ROLLBACK_FAILED"}
STACK_BUSY_STATES = {
    "CREATE_IN_PROGRESS",
    "ROLLBACK_IN_PROGRESS",
    "DELETE_IN_PROGRESS",
    "UPDATE_IN_PROGRESS",
    "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
    "UPDATE_ROLLBACK_IN_PROGRESS",
    "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
    "REVIEW_IN_PROGRESS",
}


# --------------------------------------------------------------------------- probes


def error_code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def cluster_status(eks: Any, name: str) -> str:
    """EKS status of cluster ``name`` (ACTIVE, CREATING, …) or :data:`NOT_FOUND`.

    Raises:
        botocore.exceptions.ClientError: any error other than ResourceNotFoundException.
    """
    try:
        return eks.describe_cluster(name=name)["cluster"]["status"]
    except ClientError as e:
        if error_code(e) == "ResourceNotFoundException":
            return NOT_FOUND
        raise


def nodegroup_info(eks: Any, cluster: str, ng: str) -> dict[str, Any] | None:
    """DescribeNodegroup's ``nodegroup`` for ``ng``, or None when it does not exist.

    Raises:
        botocore.exceptions.ClientError: any error other than ResourceNotFoundException.
    """
    try:
        return eks.describe_nodegroup(clusterName=cluster, nodegroupName=ng)["nodegroup"]
    except ClientError as e:
        if error_code(e) == "ResourceNotFoundException":
            return None
        raise


def nodegroup_status(eks: Any, cluster: str, ng: str) -> str:
    """EKS status of node group ``ng`` (ACTIVE, CREATE_FAILED, …) or :data:`NOT_FOUND`."""
    info = nodegroup_info(eks, cluster, ng)
    return NOT_FOUND if info is None else info["status"]


def stack_status(cfn: Any, stack: str) -> str:
    """CloudFormation status of ``stack``; :data:`NOT_FOUND` when absent or DELETE_COMPLETE.

    Raises:
        botocore.exceptions.ClientError: any error other than "does not exist".
    """
    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as e:
        if error_code(e) == "ValidationError" and "does not exist" in str(e):
            return NOT_FOUND
        raise
    status = stacks[0]["StackStatus"] if stacks else NOT_FOUND
    return NOT_FOUND if status == "DELETE_COMPLETE" else status


def stack_failure_reasons(cfn: Any, stack: str, limit: int = 5) -> list[str]:
    """Up to ``limit`` "resource: reason" lines of the stack's FAILED events (empty when unreadable)."""
    try:
        events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
    except ClientError:
        return []
    out = []
    for ev in events:
        if ev.get("ResourceStatus", "").endswith("FAILED") and ev.get("ResourceStatusReason"):
            out.append(f"{ev.get('LogicalResourceId', '?')}: {ev['ResourceStatusReason']}")
    return out[:limit]


def cluster_private_subnets(eks: Any, ec2: Any, name: str) -> dict[str, str]:
    """AZ → the cluster's private subnet there (eksctl tags them kubernetes.io/role/internal-elb).

    Raises:
        botocore.exceptions.ClientError: the cluster or its subnets cannot be described.
    """
    ids = eks.describe_cluster(name=name)["cluster"].get("resourcesVpcConfig", {}).get("subnetIds", [])
    if not ids:
        return {}
    out: dict[str, str] = {}
    for s in sorted(ec2.describe_subnets(SubnetIds=ids)["Subnets"], key=lambda s: s["SubnetId"]):
        tags = {t["Key"]: t["Value"] for t in s.get("Tags", [])}
        private = "kubernetes.io/role/internal-elb" in tags or not s.get("MapPublicIpOnLaunch", False)
        if private and "kubernetes.io/role/elb" not in tags:
            out.setdefault(s["AvailabilityZone"], s["SubnetId"])
    return out


def cluster_owner(eks: Any, cfn: Any, name: str) -> str | None:
    """The ``rayft.io/cluster`` tag of cluster ``name`` (EKS cluster tags, else its eksctl stack's tags).

    None when neither carries it: rayft did not create that cluster (``up`` only reused it).

    Raises:
        botocore.exceptions.ClientError: DescribeCluster failed (the stack lookup never raises).
    """
    tags = eks.describe_cluster(name=name)["cluster"].get("tags") or {}
    if TAG_CLUSTER in tags:
        return tags[TAG_CLUSTER]
    try:
        stacks = cfn.describe_stacks(StackName=f"eksctl-{name}-cluster")["Stacks"]
    except ClientError:
        return None
    for st in stacks:
        for t in st.get("Tags") or []:
            if t.get("Key") == TAG_CLUSTER:
                return t.get("Value")
    return None
