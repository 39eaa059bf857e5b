"""bertjax.text.sentences: the default (English) splitter, unchanged, and the multilingual one."""

import sys

import pytest

from bertjax.text.sentences import get_splitter, split_sentences, split_sentences_multilingual

# --------------------------------------------------------------------------------------------------
# split_sentences
# --------------------------------------------------------------------------------------------------

# Encyclopedic paragraphs, each built around the rules most likely to go wrong; the comment says which.
PARAGRAPHS = [
    # initials and titles never end a sentence
    (
        "J. R. R. Tolkien was an English writer and philologist. He was the author of The Hobbit. "
        "Dr. Watson and Mr. Holmes lived at 221B Baker Street.",
        [
            "J. R. R. Tolkien was an English writer and philologist.",
            "He was the author of The Hobbit.",
            "Dr. Watson and Mr. Holmes lived at 221B Baker Street.",
        ],
    ),
    # initialisms before a name; decimals and money have no space after the dot
    (
        "The U.S. Census Bureau estimated the population at 3.14 million in 2020. The median "
        "household income was $52,500.50 per year. Most residents live in the U.K. or Canada.",
        [
            "The U.S. Census Bureau estimated the population at 3.14 million in 2020.",
            "The median household income was $52,500.50 per year.",
            "Most residents live in the U.K. or Canada.",
        ],
    ),
    # e.g. / i.e. / etc. before lower case; etc. at the end of a sentence
    (
        "Many metals, e.g. iron and copper, conduct heat well, i.e. they warm quickly. Alloys such "
        "as bronze, brass, etc. are harder. Steel, pewter, etc. The list goes on.",
        [
            "Many metals, e.g. iron and copper, conduct heat well, i.e. they warm quickly.",
            "Alloys such as bronze, brass, etc. are harder.",
            "Steel, pewter, etc.",
            "The list goes on.",
        ],
    ),
    # ? and ! inside quotes, followed by lower case (no split) and by a capital (split)
    (
        '"Is this the end?" she asked. "No!" he replied. The crowd cheered! Why? Nobody knew.',
        [
            '"Is this the end?" she asked.',
            '"No!" he replied.',
            "The crowd cheered!",
            "Why?",
            "Nobody knew.",
        ],
    ),
    # closing quotes and brackets stay with the sentence they close
    (
        'He called the plan "a disaster." Critics agreed. The minister resigned (after a vote.) '
        "Elections followed in May.",
        [
            'He called the plan "a disaster."',
            "Critics agreed.",
            "The minister resigned (after a vote.)",
            "Elections followed in May.",
        ],
    ),
    # company suffixes: before a name they continue, before a sentence opener they end
    (
        "Apple Inc. CEO Tim Cook announced the product. The device was built by Foxconn Ltd. The "
        "launch was delayed. Microsoft Corp. and Google LLC. also competed.",
        [
            "Apple Inc. CEO Tim Cook announced the product.",
            "The device was built by Foxconn Ltd.",
            "The launch was delayed.",
            "Microsoft Corp. and Google LLC. also competed.",
        ],
    ),
    # version numbers, URLs and e-mail addresses
    (
        "Python 3.11.7 was released in December 2023. See https://www.python.org/downloads/ for "
        "details. Questions go to help@python.org. Version 2.7 is no longer supported.",
        [
            "Python 3.11.7 was released in December 2023.",
            "See https://www.python.org/downloads/ for details.",
            "Questions go to help@python.org.",
            "Version 2.7 is no longer supported.",
        ],
    ),
    # an ellipsis before lower case continues, before a capital ends
    (
        "The letter ended abruptly... and nothing more was heard. Years passed... Then a second "
        "letter arrived.",
        [
            "The letter ended abruptly... and nothing more was heard.",
            "Years passed...",
            "Then a second letter arrived.",
        ],
    ),
    # abbreviations before numbers (Fig. pp. Vol. No. Dec.), and "no." as an ordinary word
    (
        "The result is shown in Fig. 3 and discussed on pp. 12-15 of Vol. 2. The symphony No. 5 "
        "premiered on Dec. 22, 1808. The answer was no. Beethoven conducted.",
        [
            "The result is shown in Fig. 3 and discussed on pp. 12-15 of Vol. 2.",
            "The symphony No. 5 premiered on Dec. 22, 1808.",
            "The answer was no.",
            "Beethoven conducted.",
        ],
    ),
    # Prof. et al. St. vs. cf.
    (
        "Prof. Smith et al. studied St. Louis vs. Chicago. Their results (cf. Table 2) were clear. "
        "The city grew by 12 percent.",
        [
            "Prof. Smith et al. studied St. Louis vs. Chicago.",
            "Their results (cf. Table 2) were clear.",
            "The city grew by 12 percent.",
        ],
    ),
    # an initialism ending a sentence; sentences starting with "$" inside and with a digit
    (
        "The company moved its headquarters to Washington, D.C. The move cost $4 million. "
        "1990 was its best year.",
        [
            "The company moved its headquarters to Washington, D.C.",
            "The move cost $4 million.",
            "1990 was its best year.",
        ],
    ),
    # runs of spaces, single line breaks (joined), blank lines (paragraph breaks), no final period
    (
        "The river   rises in the\nmountains and flows\n  west.  It reaches the sea at Lima.\n\n"
        "Geography\n \nThe basin covers 2,000 km2",
        [
            "The river rises in the mountains and flows west.",
            "It reaches the sea at Lima.",
            "Geography",
            "The basin covers 2,000 km2",
        ],
    ),
    # Jr. Ph.D. a.m. and a single initial ending a sentence
    (
        "Martin Luther King Jr. Day is a federal holiday. She earned a Ph.D. in chemistry. The "
        "talk starts at 9 a.m. It ends at noon. The speaker was Malcolm X. He spoke for an hour.",
        [
            "Martin Luther King Jr. Day is a federal holiday.",
            "She earned a Ph.D. in chemistry.",
            "The talk starts at 9 a.m.",
            "It ends at noon.",
            "The speaker was Malcolm X.",
            "He spoke for an hour.",
        ],
    ),
]


@pytest.mark.parametrize("text,expected", PARAGRAPHS, ids=[f"p{i}" for i in range(len(PARAGRAPHS))])
def test_split_sentences_paragraphs(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", []),
        (" \n\n \t ", []),
        ("No terminal punctuation", ["No terminal punctuation"]),
        ("Tabs\tand\u00a0spaces\r\nacross lines.", ["Tabs and spaces across lines."]),
        ("One.\r\n\r\nTwo.", ["One.", "Two."]),  # Windows line breaks still make a blank line
        ("What?! Really.", ["What?!", "Really."]),
        ("Why? because.", ["Why? because."]),  # lower case never starts a sentence
        ("Pi is 3.14159. It is irrational.", ["Pi is 3.14159.", "It is irrational."]),
        ("Il a dit «Oui.» Ensuite il est parti.", ["Il a dit «Oui.»", "Ensuite il est parti."]),
        ("So did I. Nobody else came.", ["So did I.", "Nobody else came."]),  # "I" is no initial
        ("Charles I. Later he died.", ["Charles I.", "Later he died."]),
        ("Émile Zola, or É. Zola, wrote it.", ["Émile Zola, or É. Zola, wrote it."]),
    ],
)
def test_split_sentences_edge_cases(text, expected):
    assert split_sentences(text) == expected




# --------------------------------------------------------------------------------------------------
# Multilingual splitter
# --------------------------------------------------------------------------------------------------

blingfire = pytest.importorskip("blingfire")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("我喜欢猫。你喜欢狗吗？是的！我们走吧。", ["我喜欢猫。", "你喜欢狗吗？", "是的！", "我们走吧。"]),
        ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
        ("第一段。\n\n第二段。", ["第一段。", "第二段。"]),
        ("मैं घर जा रहा हूँ। तुम कहाँ हो? वह स्कूल गया।", ["मैं घर जा रहा हूँ।", "तुम कहाँ हो?", "वह स्कूल गया।"]),
        ("वह आया। फिर गया॥ अंत", ["वह आया।", "फिर गया॥", "अंत"]),
        ("Dr. Watson met Mr. Holmes. They talked.", ["Dr. Watson met Mr. Holmes.", "They talked."]),
    ],
)
def test_multilingual_splits_chinese_and_hindi(text, expected):
    assert get_splitter("multilingual")(text) == expected
    assert split_sentences_multilingual(text) == expected


def test_default_leaves_chinese_and_hindi_unsplit():
    assert get_splitter("default") is split_sentences
    assert split_sentences("我喜欢猫。你喜欢狗吗？") == ["我喜欢猫。你喜欢狗吗？"]
    assert split_sentences("वह आया। फिर गया।") == ["वह आया। फिर गया।"]


def test_multilingual_without_blingfire_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "blingfire", None)  # import blingfire now raises ImportError
    with pytest.raises(ValueError, match="pip install blingfire"):
        get_splitter("multilingual")


def test_unknown_splitter_names_the_key():
    with pytest.raises(ValueError, match="data.sentence_splitter='klingon' is not one of 'default', 'multilingual'"):
        get_splitter("klingon")
