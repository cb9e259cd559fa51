import unittest

from stats import median


class TestMedianHidden(unittest.TestCase):
    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_even_unsorted(self):
        self.assertEqual(median([10, 2, 8, 4]), 6)

    def test_two_values(self):
        self.assertEqual(median([1, 2]), 1.5)

    def test_odd_still_works(self):
        self.assertEqual(median([7, 3, 5, 1, 9]), 5)

    def test_empty_still_an_error(self):
        with self.assertRaises(ValueError):
            median([])


if __name__ == "__main__":
    unittest.main()
