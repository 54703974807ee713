"""placeholder replaced below"""


def add_arguments(p) -> None:
    pass
