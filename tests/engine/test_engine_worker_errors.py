"""An error raised in a data loader worker reaches the command line as its own one line."""

from polyfuse.engine.errors import original_message


def test_the_message_of_an_error_raised_in_a_loader_worker():
    wrapped = ValueError(
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n    raise ValueError(...)\nValueError: data/train.h5: dataset '
        "'features' holds NaN or Inf at 1 image(s), the first image id 3 (row 3)\n"
    )
    assert original_message(wrapped) == "data/train.h5: dataset 'features' holds NaN or Inf at 1 image(s), the first image id 3 (row 3)"
    plain = ValueError("Caught my eye: a value error of the main process")
    assert original_message(plain) == str(plain)
    assert original_message(KeyError("x")) == "'x'"
