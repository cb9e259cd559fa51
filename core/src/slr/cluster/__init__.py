"""The distributed runtime on Ray: engine replicas, rollout workers and the trainer as actors.

``slr.cluster.ray_runtime`` connects to Ray (a private local instance, or an existing
cluster); ``slr.cluster.engines`` runs engine plugins as actors and puts replicas behind
the load balancer; ``slr.cluster.workers`` runs rollout workers (sandboxes, agents and a
node-local proxy) as actors; ``slr.cluster.trainer`` runs the optimizer as one. Ray is
imported only inside these modules' functions, so ``import slr`` and a run that needs no
Ray never load it.
"""
