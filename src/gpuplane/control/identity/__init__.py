"""Who calls: roles and the authorization policy, API tokens, OIDC tokens, and team secrets."""
