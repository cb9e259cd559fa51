import unittest

from stats import mean, median, mode, variance


class TestStats(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_median_odd(self):
        self.assertEqual(median([5, 1, 3]), 3)

    def test_mode_ties_pick_smallest(self):
        self.assertEqual(mode([3, 1, 3, 1, 2]), 1)

    def test_variance(self):
        self.assertAlmostEqual(variance([1, 2, 3, 4]), 1.25)

    def test_empty_is_an_error(self):
        with self.assertRaises(ValueError):
            median([])


if __name__ == "__main__":
    unittest.main()
