"""A package outside ragen2 that brings its own environment: the tests install it into a temporary folder
(``helpers.install_outside``) and run it through ragen2 as a user's package would run."""
