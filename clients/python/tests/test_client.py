"""The client against a real pacpriv server (started by the repository's
tests/it/client.rs, which passes where through the environment):

    PACPRIV_TEST_ADDR        plaintext server: principals alice (budget 1)
                             and tiny (budget below one answer), the
                             default model and a second one, "ridge"
                             (versions 1 and 2)
    PACPRIV_TEST_TLS_ADDR    TLS server, rate limit 1 query a second
    PACPRIV_TEST_CA          the CA file of the TLS server's certificate
    PACPRIV_TEST_B           the per-query charge b, nats

    python -m unittest discover -s clients/python/tests -v
"""
import os
import unittest

from pacpriv_client import (BudgetExhausted, Client, InvalidInput, NotFound, NotReleased, PacprivError,
                            RateLimited, Unauthenticated)

ADDR = os.environ["PACPRIV_TEST_ADDR"]
TLS_ADDR = os.environ["PACPRIV_TEST_TLS_ADDR"]
CA = os.environ["PACPRIV_TEST_CA"]
B = float(os.environ["PACPRIV_TEST_B"])


def image(seed):
    """A 64-pixel input unique to `seed` (pacpriv caches exact repeats)."""
    pixels = [float((seed * 31 + j * 7) % 17) for j in range(64)]
    pixels[0] += seed / 65536.0
    return pixels


class PlainServer(unittest.TestCase):
    def setUp(self):
        self.client = Client(ADDR, "alice-key")

    def tearDown(self):
        self.client.close()

    def test_one_prediction_is_charged_once(self):
        before = self.client.budget()
        answer = self.client.predict(image(1), alpha=0.05)
        self.assertLess(answer.label, 10)
        self.assertEqual(answer.mi_charged, B)
        self.assertTrue(answer.HasField("confident"))
        self.assertEqual(answer.budget.answered, before.answered + 1)
        again = self.client.predict(image(1))
        self.assertTrue(again.cached)
        self.assertEqual((again.label, again.mi_charged), (answer.label, 0.0))

    def test_a_batch_answers_every_row(self):
        answer = self.client.predict([image(2), image(3), image(2)])
        self.assertEqual(len(answer.rows), 3)
        self.assertEqual([r.mi_charged for r in answer.rows], [B, B, 0.0])
        self.assertEqual(answer.rows[2].label, answer.rows[0].label)

    def test_two_models_charge_one_budget(self):
        before = self.client.budget()
        private = self.client.predict(image(20))
        ridge = self.client.predict(image(20), model="ridge")
        self.assertFalse(ridge.cached, "another model's answer to the same input")
        self.assertEqual((private.mi_charged, ridge.mi_charged), (B, B))
        self.assertEqual(self.client.budget().spent, before.spent + 2 * B)
        streamed = list(self.client.predict_stream([image(21)], model="ridge"))
        self.assertEqual(streamed[0].mi_charged, B)
        with self.assertRaises(NotFound) as e:
            self.client.predict(image(22), model="nope")
        self.assertIn('"ridge"', str(e.exception))

    def test_a_version_is_named_or_the_newest(self):
        newest = self.client.predict(image(23), model="ridge")
        self.assertEqual((newest.model, newest.model_version), ("ridge", "2"))
        first = self.client.predict(image(23), model="ridge", version="1")
        self.assertEqual((first.model_version, first.cached, first.mi_charged), ("1", False, B))
        with self.assertRaises(NotFound):
            self.client.predict(image(24), model="ridge", version="3")

    def test_a_stream_answers_in_order(self):
        answers = list(self.client.predict_stream(image(10 + k) for k in range(5)))
        self.assertEqual([a.query_id for a in answers], ["0", "1", "2", "3", "4"])

    def test_errors_are_typed_by_reason(self):
        with self.assertRaises(InvalidInput) as e:
            self.client.predict(image(4)[:63])
        self.assertEqual(e.exception.reason, "INVALID_INPUT")
        self.assertFalse(e.exception.charged)
        with self.assertRaises(NotReleased):
            self.client.predict(image(5), return_noisy=True)
        with Client(ADDR, "not-a-key") as stranger, self.assertRaises(Unauthenticated):
            stranger.budget()
        with Client(ADDR, "tiny-key") as tiny, self.assertRaises(BudgetExhausted) as e:
            tiny.predict(image(6))
        self.assertIsInstance(e.exception, PacprivError)
        self.assertEqual(float(e.exception.metadata["spent"]), 0.0)


class TlsServer(unittest.TestCase):
    def test_tls_and_the_rate_limit_with_its_retry_delay(self):
        with open(CA, "rb") as f:
            ca = f.read()
        with Client(TLS_ADDR, "alice-key", root_certificates=ca, server_name="localhost") as client:
            self.assertLess(client.predict(image(20)).label, 10)
            with self.assertRaises(RateLimited) as e:
                client.predict(image(21))
            self.assertGreater(e.exception.retry_after, 0.0)
            self.assertLessEqual(e.exception.retry_after, 1.0)


if __name__ == "__main__":
    unittest.main()
