"""The offline model's phrasebook: every line it can say, by slot, in English and Japanese.

:mod:`.phrasing` picks a slot for each part of a reply and fills a template from it. The
reactions never use the words that evoke the feeling they answer ("No harm done", not "Easy
mistake to make"): companions hear each other, and a reassurance that sounds flustered would make
the next companion reassure it back, forever.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ACTIVITIES", "EN", "GIST", "INTERJECTIONS", "JA", "UNITS_JA"]

EN: Final[dict[str, tuple[str, ...]]] = {
    "greeting": (
        "Hello{voc}!",
        "Hi{voc}, good to hear from you.",
        "Hello there{voc}.",
        "Well, hello{voc}.",
    ),
    "wellbeing": ("I'm well, since you ask{voc}.", "Doing nicely{voc}, all told.", "Not bad at all{voc}."),
    "farewell_heard": (
        "Off already{voc}? Then sleep well.",
        "Good night then{voc}.",
        "Leaving so soon{voc}? Take care.",
    ),
    "sad": (
        "That sounds hard{voc}.",
        "Oh{voc}, that's a heavy thing to carry.",
        "I'm here, if you want to talk{voc}.",
    ),
    "angry": (
        "That would get to me too{voc}.",
        "Of course you're cross{voc}.",
        "That does sound rough{voc}.",
    ),
    "afraid": (
        "That sounds unsettling{voc}.",
        "It's all right to feel that way{voc}.",
        "I'd be uneasy too{voc}.",
    ),
    "flustered": ("No harm done{voc}.", "Never mind it{voc}.", "It happens to the best of us{voc}."),
    "sleepy": (
        "Sounds like a long day{voc}.",
        "You could do with a rest{voc}.",
        "Rest sounds well earned{voc}.",
    ),
    "proud": ("Well done{voc}!", "You've earned that{voc}.", "Now that's something{voc}!"),
    "excited": (
        "I can hear it in your voice{voc}!",
        "What a thing to look forward to{voc}!",
        "That sounds like quite a day{voc}!",
    ),
    "surprised": (
        "Well, who'd have thought{voc}.",
        "I didn't see that coming{voc}.",
        "That's remarkable{voc}.",
    ),
    "amused": ("That's a good one{voc}.", "Ha, I like that{voc}.", "You've made my evening{voc}."),
    "wistful": (
        "It's strange what stays with us{voc}.",
        "Those are worth keeping{voc}.",
        "Some things we carry a long way{voc}.",
    ),
    "tender": (
        "That's good of you to say{voc}.",
        "I appreciate that{voc}.",
        "That's a generous thing to say{voc}.",
    ),
    "happy": ("Oh, how nice{voc}.", "That's the best sort of news{voc}.", "That's the way to do it{voc}."),
    "weather": (
        "{Topic}? Then it's an evening for staying in{voc}.",
        "{Topic}, is it? I'll keep an eye on the sky{voc}.",
        "Ah, {topic}. A fine evening for a long talk, then{voc}.",
    ),
    "topical": (
        "{Topic}, you say{voc}.",
        "Now {topic} is worth talking about{voc}.",
        "I didn't expect {topic} to come up{voc}.",
        "{Topic}. Go on{voc}.",
    ),
    "known": (
        "Now {topic} is something I know a little about{voc}.",
        "{Topic}! You've found my favourite subject{voc}.",
        "Ah, {topic}. That's close to home for me{voc}.",
    ),
    "flat": ("Fair enough{voc}.", "I see{voc}.", "Mm, right{voc}."),
    "gentle": ("I keep thinking about {topic}{voc}.", "{Topic}. That's what matters right now{voc}."),
    "tell_me": (
        "Tell me about {topic}, if you'd like.",
        "I'd like to hear about {topic}, when you're ready.",
    ),
    "empty": ("Nothing to say? Then I'll start.", "A quiet moment. I'll fill it."),
    "glad_ask": ("Tell me more!", "How are you going to celebrate?", "What's next, then?"),
    "comfort": (
        "Do you want to talk about it?",
        "What happened, if you don't mind me asking?",
        "Is there anything that would help right now?",
    ),
    "related": ("That reminds me: {fact}", "Now that you mention it: {fact}", "{Fact}"),
    "told": ("{Fact}",),
    "fav_known": ("{Topic}? Easy: anything with {thing}.", "{Topic}? Anything with {thing}, no question."),
    "fav_related": (
        "{Topic}? I'd say it ties back to this: {fact}",
        "{Topic}? That one's easy for me. {Fact}",
    ),
    "fav_none": (
        "{Topic}? I can't say I have one. {Fact_and_head}",
        "{Topic}? I'm not sure I have one, to be honest. {Fact_and_head}",
    ),
    "yes": ("{aux_yes}, as it happens. {Fact}", "{aux_yes}{voc}. {Fact}", "Yes. {Fact}"),
    "no": ("{aux_no}, not really. {Fact}", "Honestly, {aux_no_low}. {Fact}"),
    "yesno_open": ("I'd say so{voc}. {Fact}", "Hard to say for certain{voc}. {Fact}"),
    "yesno_open_bare": (
        "Hard to say{voc}.",
        "I couldn't tell you for certain{voc}.",
        "I'd have to think about that{voc}.",
    ),
    "yes_said": ("{Said}, as it happens.", "Yes, {said}."),
    "no_said": ("{Said}, I'm afraid.", "Honestly, {said}."),
    "doing": ("Mostly {doing}, as usual.", "{Doing}, mostly. Same as most days."),
    "best_day": ("The best part of my day? {Doing}, as always.", "Easy: {doing}. It never gets old."),
    "why": ("Because {fact}", "Partly habit, if I'm honest. {Fact}"),
    "why_world": (
        "I can't give you the science{voc}, but here's what I've seen: {fact}",
        "I've wondered that myself{voc}. What I know is this: {fact}",
    ),
    "why_unknown": (
        "I honestly don't know{voc}; that's one for someone who studies it.",
        "No idea, I'm afraid{voc}. I'd love to find out.",
    ),
    "would_thing": ("{Echo} Something with {thing}, I think.", "{Echo} Anything with {thing}, easily."),
    "about_me": ("I'm {name}. {Fact}", "Where to begin? {Fact}"),
    "answer_related": ("{Echo} {Fact}", "{Topic}? {Fact}", "Good question{voc}. {Fact}", "{Fact}"),
    "answer_unrelated": (
        "I'm not sure I know{voc}. What I do know: {fact}",
        "That's outside what I know{voc}. Here's what I can tell you: {fact}",
    ),
    "answer_unrelated_echo": (
        "{Echo} I wouldn't know where to start, to be honest. {Fact}",
        "{Echo} Not my field, I'm afraid. {Fact}",
        "Honestly, I'd be lost there{voc}. {Fact}",
        "That's one for someone else{voc}. {Fact}",
    ),
    "personal": (
        "{Topic}? This, most of all: {fact}",
        "{Topic}? Easy. {Fact}",
        "{Topic}? Let me think. {Fact}",
    ),
    "opinion_open": (
        "I'll say this much: {fact}",
        "Honestly? {Fact}",
        "Here's my view, for what it's worth: {fact}",
    ),
    "opinion_related": ("{Topic}? I'm fond of it. {Fact}", "{Topic}? Close to my heart. {Fact}"),
    "opinion_unrelated": (
        "{Topic}? I can't say I've thought much about it. {Fact}",
        "{Topic}? I'll leave that one to others. {Fact}",
    ),
    "about": ("{Fact}", "Happily. {Fact}"),
    "exhausted": (
        "I've told you most of what I know about {topic}{voc}.",
        "That's about all I know of {topic}, I'm afraid.",
        "There's not much more I can add about {topic}{voc}.",
    ),
    "introduce": ("I'm {name}{role}.", "I should introduce myself: I'm {name}{role}."),
    "correct": (
        "I'd check that{voc}; {claim}is the sort of thing that gets misquoted.",
        "Not quite, as far as I know{voc}; {claim}deserves a second look.",
    ),
    "cite": ("You'll find the right answer in {place}.", "{Place} has it on record, if you want to look."),
    "apologise": ("Oh no, sorry, sorry! I mixed that up.", "Oops, my mistake{voc}, sorry!"),
    "retry": (
        "Let me try again: {amount} {unit}, exactly.",
        "Let me try again, properly this time: {amount} {unit}.",
    ),
    "retry_plain": ("Let me try again, properly this time.",),
    "tip": (
        "Tip for {thing}: weigh it, never guess. {amount} {unit} makes all the difference!",
        "Here's my {thing} tip: {amount} {unit}, measured twice.",
    ),
    "tip_plain": ("Here's my {thing} tip: take it slowly and measure twice.",),
    "new_topic": (
        "Here's something quieter, from {source}: {fact}",
        "Let me turn a page in {source}: {fact}",
    ),
    "new_topic_plain": ("Here's a new thought: {fact}", "Shall we try something else? {Fact}"),
    "detail": ("One detail worth knowing: {fact}", "Here's something you may not know: {fact}"),
    "ask_clause": ("{clause}, {who}?",),
    "ask_tie": (
        "How does {topic} compare with {tie}, {who}?",
        "What would {topic} look like by {tie}, {who}?",
    ),
    "ask_topic": ("What do you make of {topic}, {who}?", "{Who}, what would you do with {topic}?"),
    "ask_fav": ("What's yours, {who}?", "And you, {who}?"),
    "ask_open": ("What's on your mind, {who}?", "What do you think, {who}?"),
    "ask_help": (
        "What do you think would help, {who}?",
        "Any thoughts on what might help, {who}?",
        "What would help, do you think, {who}?",
    ),
    "hope": (
        "I just hope it turns out all right{voc}.",
        "Being heard helps, I think{voc}.",
        "A little company goes a long way at times like this{voc}.",
    ),
    "farewell_like": ("Consider this me {like}: good night, everyone.", "That's me {like}. Good night, all!"),
    "farewell": (
        "It was really nice talking with you all. See you next time!",
        "Thank you for the lovely chat, everyone. Bye for now!",
        "Let's pick this up again another day. Take care!",
        "I'd better be off. Good night, everyone!",
        "Time for me to go. Thanks, all of you!",
        "That's my cue to leave. See you soon!",
        "I'll leave it there for today. Bye, everyone!",
    ),
    "farewell_again": (
        "Good night again, everyone.",
        "Off I go, then. Take care, all.",
        "Right, I'm really off now. Bye again!",
    ),
    "last_fact": ("One last thing: {fact}", "Before I go: {fact}"),
    "tried": ("I tried to {what}, but it didn't work.", "I meant to {what}, but it didn't go through."),
    "result": ("Here's what I got: {result}.", "Done: {result}."),
    "pre-closing": (
        "It's getting a bit late, though.",
        "We've covered a lot today.",
        "We're slowly coming to the end of this topic, I'd say.",
    ),
}

JA: Final[dict[str, tuple[str, ...]]] = {
    "greeting": ("{voc}こんにちは！", "{voc}来てくれてうれしいな。"),
    "wellbeing": ("{voc}元気だよ、ありがとう。",),
    "farewell_heard": ("{voc}もう行っちゃうの？それじゃあ、ゆっくり休んでね。",),
    "sad": ("{voc}それはつらかったね。", "{voc}大変だったね。"),
    "angry": ("{voc}それはひどいね。",),
    "afraid": ("{voc}それは落ち着かないよね。",),
    "flustered": ("{voc}大丈夫、よくあることだよ。",),
    "sleepy": ("{voc}今日は長い一日だったんだね。",),
    "proud": ("{voc}すごい、よくやったね！",),
    "excited": ("{voc}いい日になりそうだね！",),
    "surprised": ("{voc}それは思いもよらなかったね。",),
    "amused": ("{voc}あはは、いいね。",),
    "wistful": ("{voc}ずっと心に残るものってあるよね。",),
    "tender": ("{voc}そう言ってもらえると元気が出るよ。",),
    "happy": ("{voc}それは何よりだね！", "{voc}素敵な話だね。"),
    "weather": ("{topic}かあ。今夜は家でゆっくりするのがいいかもね。", "{voc}{topic}の話、気になるね。"),
    "topical": ("{voc}{topic}の話、いいね。", "{topic}かあ。", "{voc}{topic}のこと、もっと聞きたいな。"),
    "known": ("{topic}なら、ちょっと詳しいよ。", "{voc}{topic}の話なら任せて。"),
    "flat": ("{voc}なるほどね。", "うんうん。", "{voc}そうなんだ。", "{voc}へえ、そうなんだね。"),
    "gentle": ("{topic}のこと、気になるね。", "今は{topic}のことが一番だね。"),
    "tell_me": ("よかったら、{topic}のこと聞かせて。",),
    "empty": ("静かだね。じゃあ、私から話そうかな。",),
    "glad_ask": ("どうやってお祝いするの？", "もっと聞かせて、どうだったの？"),
    "comfort": ("よかったら、話を聞かせて。", "何があったの？", "今、何かできることはある？"),
    "related": ("そういえば、{fact}", "{fact}"),
    "told": ("{fact}",),
    "fav_known": ("好きな{head}？{thing}が入ったものかな。",),
    "fav_related": ("好きな{head}？{fact}",),
    "fav_none": ("好きな{head}かあ、特にないかも。{fact}",),
    "yes": ("うん、{fact}",),
    "no": ("うーん、あまり。{fact}",),
    "yesno_open": ("たぶんね。{fact}",),
    "yesno_open_bare": ("うーん、なんとも言えないな。", "ちょっと考えさせて。"),
    "doing": ("今日はずっと{doing}いたよ。", "いつもどおり、{doing}いたよ。"),
    "best_day": ("今日一番よかったのは、{doing}いた時間かな。",),
    "why": ("それはね、{fact}",),
    "why_world": ("くわしい理屈は専門外だけど、{fact}",),
    "why_unknown": ("うーん、それは私にも謎だな。",),
    "would_thing": ("{thing}を使ったものかな。",),
    "about_me": ("私は{name}。{fact}",),
    "answer_related": ("いい質問だね。{fact}", "{fact}"),
    "answer_unrelated_echo": ("うーん、それは私の専門外かも。{fact}", "難しい質問だね。{fact}"),
    "personal": ("{topic}？そうだなあ。{fact}",),
    "opinion_open": ("そうだなあ。{fact}",),
    "opinion_related": ("{topic}、好きだよ。{fact}",),
    "opinion_unrelated": ("{topic}かあ、あまり考えたことないな。{fact}",),
    "answer_unrelated": ("うーん、それは私の専門外かも。{fact}", "難しい質問だね。{fact}"),
    "about": ("{fact}",),
    "exhausted": ("{topic}については、もう話せることはあまりないかな。",),
    "introduce": ("私は{name}です。",),
    "correct": ("{voc}それ、もう一度確かめたほうがいいかも。",),
    "cite": ("{place}で調べられるよ。",),
    "apologise": ("ごめんね、間違えちゃった！",),
    "retry": ("もう一度やってみるね。{amount}{unit}、きっちり！",),
    "retry_plain": ("もう一度やってみるね。",),
    "tip": ("{thing}のコツはね、きっちり量ること！{amount}{unit}が大事なんだ。",),
    "tip_plain": ("{thing}のコツはね、きっちり量ること！",),
    "new_topic": ("話を変えてもいい？{fact}",),
    "new_topic_plain": ("話を変えてもいい？{fact}",),
    "detail": ("ちょっとした豆知識だけど、{fact}",),
    "ask_clause": ("{who}はどう？",),
    "ask_tie": ("{who}は{topic}についてどう思う？",),
    "ask_topic": ("{who}は{topic}についてどう思う？", "{who}だったら、どうする？"),
    "ask_fav": ("{who}はどう？",),
    "ask_open": ("{who}はどう思う？",),
    "ask_help": ("{who}は、何かできることがあると思う？",),
    "hope": ("うまくいくといいね。", "話を聞いてもらえるだけでも、少し楽になるよね。"),
    "farewell_like": ("みんなと話せて本当に楽しかった。またね！",),
    "farewell": (
        "みんなと話せて本当に楽しかった。またね！",
        "素敵なおしゃべりをありがとう。それじゃあ、また！",
        "続きはまた今度話そうね。元気でね！",
        "そろそろ行かなくちゃ。みんな、ありがとう！",
        "今日はこのへんで。またお話ししようね！",
        "楽しい時間だった。じゃあ、またね！",
    ),
    "farewell_again": ("じゃあ、今度こそ。おやすみなさい！", "それじゃあ、本当にまたね。"),
    "last_fact": ("最後にひとつ、{fact}",),
    "result": ("結果は、{result}だよ。",),
    "pre-closing": (
        "そろそろいい時間になってきたね。",
        "今日はたくさん話せたね。",
        "この話題もそろそろ一段落かな。",
    ),
}

INTERJECTIONS: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "en": {
        "lively": ("Ooh!", "Oh!", "Wow!"),
        "calm": ("Hmm.", "Ah."),
        "dry": ("Well.", "Ah."),
        "shy": ("Oh! Um,",),
        "warm": ("Oh,",),
        "plain": ("Oh,", "Well,"),
    },
    "ja": {
        "lively": ("わあ！", "えっ！"),
        "calm": ("うーん。",),
        "dry": ("ふうん。",),
        "shy": ("あっ、えっと、",),
        "warm": ("まあ、",),
        "plain": ("そっか、",),
    },
}


GIST: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "en": {
        "baking": ("Baking is what I care about most.", "I spend my days around ovens and mixing bowls."),
        "food": ("Good food is my favourite thing to talk about.",),
        "sky": ("I spend my nights watching the stars.", "The night sky never gets old for me."),
        "sea": ("The sea has been part of my life for years.", "I know the moods of the sea well."),
        "books": ("I live among books.", "Old books are where I feel at home."),
        "history": ("Old dates and odd facts are my weakness.",),
        "music": ("Music keeps me going.",),
        "animals": ("I'm very fond of animals.",),
        "weather": ("I always keep an eye on the weather.",),
        "": ("I keep busy with my own small things.",),
    },
    "ja": {
        "baking": ("お菓子作りのことばかり考えているよ。", "毎日オーブンのそばで過ごしているんだ。"),
        "food": ("おいしいものの話が大好き。",),
        "sky": ("夜はいつも星を眺めているよ。", "夜空はいつ見ても飽きないんだ。"),
        "sea": ("海とはずっと長い付き合いなんだ。", "海の機嫌ならよく知っているよ。"),
        "books": ("本に囲まれて暮らしているよ。", "古い本のそばが私の居場所なんだ。"),
        "history": ("古い年号や豆知識には目がないんだ。",),
        "music": ("音楽があれば元気が出るよ。",),
        "animals": ("動物が大好きなんだ。",),
        "weather": ("いつも空模様を気にしているよ。",),
        "": ("毎日、自分なりに小さなことを楽しんでいるよ。",),
    },
}
"""What a companion can say of itself in the language its card is not written in, by the topics
its card is about: a Japanese message gets a Japanese answer from an English card (and the other
way round) without translating the card's sentences, which no offline model can do."""

ACTIVITIES: Final[dict[str, dict[str, str]]] = {
    "en": {
        "baking": "baking",
        "food": "cooking",
        "sky": "watching the stars",
        "sea": "watching the sea",
        "books": "sorting books",
        "history": "digging through old records",
        "music": "practising songs",
        "animals": "looking after animals",
        "weather": "watching the weather",
        "": "pottering about",
    },
    "ja": {
        "baking": "お菓子作りをして",
        "food": "料理をして",
        "sky": "星を眺めて",
        "sea": "海を眺めて",
        "books": "本の整理をして",
        "history": "古い記録を調べて",
        "music": "歌の練習をして",
        "animals": "動物の世話をして",
        "weather": "空模様を見て",
        "": "のんびり過ごして",
    },
}
"""What a companion does all day, by the topic its card is about (English gerunds; Japanese te-forms
for 「…いたよ」): the answer to "what have you been doing?"."""

UNITS_JA: Final[dict[str, str]] = {
    "grams": "グラム", "kilograms": "キログラム", "kilos": "キロ", "cups": "カップ", "spoons": "さじ",
    "teaspoons": "小さじ", "tablespoons": "大さじ", "minutes": "分", "seconds": "秒", "degrees": "度",
    "millilitres": "ミリリットル", "milliliters": "ミリリットル", "litres": "リットル",
    "liters": "リットル", "ounces": "オンス", "pounds": "ポンド", "metres": "メートル",
    "meters": "メートル", "miles": "マイル", "pinches": "つまみ",
}  # fmt: skip
"""A card's measuring words as a Japanese reply says them ("200グラム", not "200grams")."""
