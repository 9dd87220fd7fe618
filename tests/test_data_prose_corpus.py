"""The man-pages prose corpus: troff source becomes plain English text."""
from data.prose_corpus import troff_to_text

PAGE = r'''.\" Copyright notice: a comment, dropped
.TH SIGNAL 7 2022-10-30 "Linux man-pages 6.03"
.SH NAME
signal \- overview of signals
.SH DESCRIPTION
A process can change the disposition of a signal using
.BR sigaction (2)
or
.IR "signal handler" ,
a \fBprogrammer-defined\fP function (see \(lqsignal\(rq).
.PP
.TP
.B SIGINT
Interrupt from keyboard\(emusually Ctrl\-C.
'''


def test_troff_becomes_text():
    text = troff_to_text(PAGE)
    assert text.splitlines() == [
        "NAME",
        "signal - overview of signals",
        "DESCRIPTION",
        "A process can change the disposition of a signal using",
        "sigaction(2)",
        "or",
        "signal handler,",
        'a programmer-defined function (see "signal").',
        "SIGINT",
        "Interrupt from keyboard-usually Ctrl-C.",
    ]


def test_alias_page_is_empty():
    assert troff_to_text(".so man2/open.2\n") == ""
