"""The distributed runtime: Ray, and engine replicas as Ray actors.

``slr.runtime.cluster`` connects to Ray (a private local instance, or an existing
cluster); ``slr.runtime.engines`` runs engine plugins as actors and puts replicas behind
the load balancer. Ray is imported only inside these modules' functions, so ``import slr``
and a run that needs no Ray never load it.
"""
