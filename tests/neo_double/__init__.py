"""A Forge Neo double (Neo at 5692d2d): what Neo does differently from Forge, over the Forge double (see README.md)."""
